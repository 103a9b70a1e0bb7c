pub mod certmanager;
pub mod credentials;
pub mod grants;
pub mod helper;
pub mod template;
