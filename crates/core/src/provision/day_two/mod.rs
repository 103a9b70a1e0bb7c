pub mod recorder;
pub mod renewal;
