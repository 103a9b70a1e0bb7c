pub mod broker;
pub mod discovery;
pub mod dispatch;
pub mod events;
pub mod leadership;
pub mod registry;
