pub mod host;
pub mod version;
