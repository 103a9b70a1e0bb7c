pub mod broker;
pub mod discovery;
pub mod dispatch;
pub mod events;
pub mod lanes;
pub mod leadership;
pub mod registry;
