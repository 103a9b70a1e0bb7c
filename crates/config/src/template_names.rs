//! The names templates go by: the sections of `configuration_template:` and
//! `section.key`, the name each template is compiled and rendered under.
//!
//! The one module `template` and `interpolation` both use, so the dependency
//! between them runs one way: `template` compiles the templates and installs
//! `interpolation`'s checks into their environment; `interpolation` decides
//! from a template's name where its values land and knows nothing else of
//! templates. (The names once lived in `template`, which made the two import
//! each other.)

/// The template sections, as they are named in the file and in errors.
pub const CONFIGURATION: &str = "configuration";
pub const ACTION_POLICIES: &str = "action_policies";
pub const OPA_POLICIES: &str = "opa_policies";
pub const UPGRADE: &str = "upgrade";

/// The environment's name of one template: `section.key`.
pub fn template_name(section: &str, key: &str) -> String {
    if key.is_empty() {
        section.to_string()
    } else {
        format!("{section}.{key}")
    }
}
