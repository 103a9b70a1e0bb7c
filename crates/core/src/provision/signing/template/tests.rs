use super::*;
use crate::provision::signing::helper::CsrReply;
use choria_wire::security::tokens::ProvisioningClaims;
use std::collections::BTreeMap;

fn template(configuration: &[(&str, &str)]) -> ConfigurationTemplate {
    ConfigurationTemplate {
        configuration: configuration
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

const INVENTORY: &str = r#"{"agents":["rpcutil","choria_provision"],"facts":{"dc":"ams1","role":"web"},"classes":["base","web"],"version":"0.30.2"}"#;

fn input<'a>(identity: &'a str, inventory: &'a str) -> HelperInput<'a> {
    HelperInput {
        identity,
        csr: None,
        ed25519_pubkey: None,
        inventory,
        jwt: None,
    }
}

#[test]
fn settings_are_rendered_from_identity_inventory_site_and_values() {
    let mut t = template(&[
        ("identity", "{{ identity }}"),
        ("plugin.choria.middleware_hosts", "{{ values.broker }}"),
        ("classes", "{{ inventory.classes | join(',') }}"),
        (
            "plugin.choria.srv_domain",
            "{{ inventory.facts.dc }}.{{ site }}.example.net",
        ),
        ("registration_interval", "{{ values.interval }}"),
    ]);
    t.values = [
        ("broker".to_string(), json!("nats://b.example.net:4222")),
        ("interval".to_string(), json!(300)),
    ]
    .into();
    let n = NodeTemplate::new(&t, "eu").unwrap();
    let r = n.render(&input("web1.example.net", INVENTORY)).unwrap();
    let want: BTreeMap<String, String> = [
        ("identity", "web1.example.net"),
        (
            "plugin.choria.middleware_hosts",
            "nats://b.example.net:4222",
        ),
        ("classes", "base,web"),
        ("plugin.choria.srv_domain", "ams1.eu.example.net"),
        ("registration_interval", "300"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(r.configuration, want);
    assert!(!r.defer && !r.shutdown && r.certificate.is_empty());
}

#[test]
fn an_undefined_value_fails_naming_the_setting() {
    let n = NodeTemplate::new(&template(&[("x", "{{ inventory.facts.missing }}")]), "").unwrap();
    let e = n.render(&input("n1", INVENTORY)).unwrap_err();
    assert_eq!(e.name, "configuration.x");
    assert!(
        e.to_string()
            .starts_with("configuration_template.configuration.x: "),
        "{e}"
    );
    assert!(e.message.contains("undefined"), "{e}");
}

#[test]
fn a_node_cannot_smuggle_settings_in_through_a_fact() {
    let evil = r#"{"facts":{"role":"web\nplugin.security.provider = none"}}"#;
    let n = NodeTemplate::new(&template(&[("role", "{{ inventory.facts.role }}")]), "").unwrap();
    let e = n.render(&input("n1", evil)).unwrap_err();
    assert_eq!(e.name, "configuration.role");
    assert!(e.message.contains("line break"), "{e}");
    // A policy is a file: its lines are its own.
    let t = ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        action_policies: [(
            "rpcutil.policy".to_string(),
            "policy default deny\nallow\t*\t*\t*\t{{ inventory.facts.role }}\n".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let r = NodeTemplate::new(&t, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .unwrap();
    assert_eq!(
        r.action_policies["rpcutil.policy"],
        "policy default deny\nallow\t*\t*\t*\tweb\n"
    );
}

#[test]
fn a_node_cannot_choose_its_own_collectives_through_a_fact() {
    // The attack: a fact with a comma becomes two collectives.
    let evil = r#"{"facts":{"dc":"lon,admin"}}"#;
    let honest = r#"{"facts":{"dc":"lon"}}"#;
    let n = NodeTemplate::new(
        &template(&[("collectives", "mcollective,{{ inventory.facts.dc }}")]),
        "",
    )
    .unwrap();
    let e = n.render(&input("n1", evil)).unwrap_err();
    assert_eq!(e.name, "configuration.collectives");
    assert_eq!(e.refused, Some(Place::ListSetting));
    assert!(e.message.contains("list-valued setting"), "{e}");
    assert_eq!(
        n.render(&input("n1", honest)).unwrap().configuration["collectives"],
        "mcollective,lon",
        "the template's own comma is the author's"
    );
    for evil in [
        r#"{"facts":{"dc":"lon admin"}}"#,
        r#"{"facts":{"dc":"lon	admin"}}"#,
    ] {
        assert!(n.render(&input("n1", evil)).is_err(), "{evil}");
    }
    // The same for the brokers a node is sent to.
    let n = NodeTemplate::new(
        &template(&[(
            "plugin.choria.middleware_hosts",
            "{{ inventory.facts.broker }}",
        )]),
        "",
    )
    .unwrap();
    let two = r#"{"facts":{"broker":"nats://a:4222,nats://evil:4222"}}"#;
    assert!(n.render(&input("n1", two)).is_err());
}

#[test]
fn a_fact_cannot_add_lines_or_fields_to_a_policy() {
    let t = |policy: &str| ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        action_policies: [("rpcutil.policy".to_string(), policy.to_string())].into(),
        ..Default::default()
    };
    let rule = "policy default deny\nallow {{ inventory.facts.role }} * * *\n";
    let n = NodeTemplate::new(&t(rule), "").unwrap();
    for evil in [
        r#"{"facts":{"role":"x\nallow * * * *"}}"#,
        r#"{"facts":{"role":"* * * *\nallow x"}}"#,
        r#"{"facts":{"role":"cert=x *"}}"#,
    ] {
        let e = n.render(&input("n1", evil)).unwrap_err();
        assert_eq!(e.refused, Some(Place::ActionPolicy), "{evil}: {e}");
    }
    let r = n
        .render(&input("n1", r#"{"facts":{"role":"choria=web"}}"#))
        .unwrap();
    assert_eq!(
        r.action_policies["rpcutil.policy"],
        "policy default deny\nallow choria=web * * *\n"
    );
    // Rego: a value cannot close a string and add a rule.
    let rego = ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        opa_policies: [(
            "default.rego".to_string(),
            "allow { input.agent == \"{{ inventory.facts.role }}\" }\n".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let n = NodeTemplate::new(&rego, "").unwrap();
    let e = n
        .render(&input(
            "n1",
            r#"{"facts":{"role":"x\"} allow { true } #"}}"#,
        ))
        .unwrap_err();
    assert_eq!(e.refused, Some(Place::OpaPolicy), "{e}");
}

#[test]
fn the_author_can_vouch_for_a_trusted_value_per_use() {
    let mut t = template(&[
        (
            "plugin.choria.middleware_hosts",
            "{{ values.brokers | allow_separators }}",
        ),
        ("collectives", "{{ values.collectives }}"),
    ]);
    t.values = [
        ("brokers".to_string(), json!("nats://a:4222, nats://b:4222")),
        ("collectives".to_string(), json!("a,b")),
    ]
    .into();
    let e = NodeTemplate::new(&t, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .unwrap_err();
    assert_eq!(
        e.name, "configuration.collectives",
        "only the vouched use passes"
    );
    t.configuration.insert(
        "collectives".into(),
        "{{ values.collectives | allow_separators }}".into(),
    );
    let r = NodeTemplate::new(&t, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .unwrap();
    assert_eq!(
        r.configuration["plugin.choria.middleware_hosts"],
        "nats://a:4222, nats://b:4222"
    );
    assert_eq!(r.configuration["collectives"], "a,b");
    // Vouching never lets a line break into a setting.
    t.values.insert("brokers".into(), json!("a\nb"));
    assert!(NodeTemplate::new(&t, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .is_err());
}

#[test]
fn an_oversized_rendering_fails() {
    let n = NodeTemplate::new(&template(&[("x", "{{ 'a' * 70000 }}")]), "").unwrap();
    let e = n.render(&input("n1", INVENTORY)).unwrap_err();
    assert!(e.message.contains("more than 65536"), "{e}");
}

#[test]
fn the_jwt_claims_are_there_without_the_token_and_the_csr_paths_too() {
    let claims = ProvisioningClaims {
        token: "s3cret-token".into(),
        prov_nats_pass: "s3cret-password".into(),
        srv_domain: "example.net".into(),
        ..Default::default()
    };
    let csr = CsrReply {
        ssldir: "/etc/choria/ssl".into(),
        ..Default::default()
    };
    let t = template(&[
        ("srv", "{{ jwt.chsrv }}"),
        ("cert", "{{ csr.ssldir }}/cert.pem"),
        ("all", "{{ jwt | tojson }}"),
    ]);
    let mut i = input("n1", INVENTORY);
    i.jwt = Some(&claims);
    i.csr = Some(&csr);
    let r = NodeTemplate::new(&t, "").unwrap().render(&i).unwrap();
    assert_eq!(r.configuration["srv"], "example.net");
    assert_eq!(r.configuration["cert"], "/etc/choria/ssl/cert.pem");
    assert!(
        !r.configuration["all"].contains("s3cret"),
        "neither the token nor the password: {}",
        r.configuration["all"]
    );
    let e = NodeTemplate::new(&template(&[("t", "{{ jwt.cht }}")]), "")
        .unwrap()
        .render(&i)
        .unwrap_err();
    assert!(e.message.contains("undefined"), "{e}");
}

#[test]
fn an_inventory_that_is_not_json_is_simply_absent() {
    let n = NodeTemplate::new(&template(&[("id", "{{ identity }}")]), "").unwrap();
    assert_eq!(
        n.render(&input("n1", "not json")).unwrap().configuration["id"],
        "n1"
    );
    let n = NodeTemplate::new(&template(&[("v", "{{ inventory.version }}")]), "").unwrap();
    assert!(n.render(&input("n1", "not json")).is_err());
}

#[test]
fn the_upgrade_version_is_rendered_and_trimmed() {
    let t = ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        upgrade: Some(" {{ values.v }}\n".into()),
        values: [("v".to_string(), json!("0.31.0"))].into(),
        ..Default::default()
    };
    let r = NodeTemplate::new(&t, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .unwrap();
    assert_eq!(r.upgrade, "0.31.0");
}

#[test]
fn the_helper_answer_is_merged_over_the_template() {
    let map = |p: &[(&str, &str)]| -> BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let from_template = HelperResponse {
        configuration: map(&[("identity", "t-id"), ("loglevel", "info")]),
        action_policies: map(&[("rpcutil", "t-policy"), ("puppet", "t-puppet")]),
        upgrade: "0.30.0".into(),
        ..Default::default()
    };
    let from_helper = HelperResponse {
        configuration: map(&[("loglevel", "debug"), ("extra", "1")]),
        action_policies: map(&[("rpcutil", "h-policy")]),
        certificate: "CERT".into(),
        ..Default::default()
    };
    let m = merge(from_template, from_helper);
    assert_eq!(
        m.configuration,
        map(&[("extra", "1"), ("identity", "t-id"), ("loglevel", "debug")])
    );
    assert_eq!(
        m.action_policies,
        map(&[("puppet", "t-puppet"), ("rpcutil", "h-policy")])
    );
    assert_eq!(m.upgrade, "0.30.0", "the helper gave none");
    assert_eq!(m.certificate, "CERT");
    let m = merge(
        HelperResponse {
            upgrade: "0.30.0".into(),
            ..Default::default()
        },
        HelperResponse {
            upgrade: "0.31.0".into(),
            defer: true,
            ..Default::default()
        },
    );
    assert_eq!(m.upgrade, "0.31.0");
    assert!(m.defer);
}

#[test]
fn a_fact_cannot_make_a_policy_field_a_wildcard_or_pattern() {
    // Before, a fact of `*` or `/.*/` filled the caller field and let
    // every caller through.
    let t = |policy: &str| ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        action_policies: [("rpcutil.policy".to_string(), policy.to_string())].into(),
        ..Default::default()
    };
    let plain = NodeTemplate::new(
        &t("policy default deny\nallow\t{{ inventory.facts.role }}\t*\t*\t*\n"),
        "",
    )
    .unwrap();
    let pair = NodeTemplate::new(
        &t("policy default deny\nallow\t{{ inventory.facts.a }}x{{ inventory.facts.b }}\t*\t*\t*\n"),
        "",
    )
    .unwrap();
    let regex = NodeTemplate::new(
        &t("policy default deny\nallow\t/^choria={{ inventory.facts.role }}$/\t*\t*\t*\n"),
        "",
    )
    .unwrap();
    for (n, facts) in [
        (&plain, r#"{"facts":{"role":"*"}}"#),
        (&plain, r#"{"facts":{"role":"/.*/"}}"#),
        (&pair, r#"{"facts":{"a":"/","b":"/"}}"#),
        (&regex, r#"{"facts":{"role":".*"}}"#),
    ] {
        let e = n.render(&input("n1", facts)).unwrap_err();
        assert_eq!(e.refused, Some(Place::ActionPolicy), "{facts}: {e}");
    }
    let r = regex
        .render(&input("n1", r#"{"facts":{"role":"web"}}"#))
        .unwrap();
    assert_eq!(
        r.action_policies["rpcutil.policy"],
        "policy default deny\nallow\t/^choria=web$/\t*\t*\t*\n",
        "the author's own pattern and wildcards stay, the marks are gone"
    );
    // The author may vouch for a value of their own.
    let mut vouched =
        t("policy default deny\nallow\t{{ values.admins | allow_patterns }}\t*\t*\t*\n");
    vouched.values = [("admins".to_string(), json!("/^choria=ops\\./"))].into();
    let r = NodeTemplate::new(&vouched, "")
        .unwrap()
        .render(&input("n1", INVENTORY))
        .unwrap();
    assert!(r.action_policies["rpcutil.policy"].contains("/^choria=ops\\./"));
    // Rego: a wildcard value is refused there too.
    let rego = ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        opa_policies: [(
            "default.rego".to_string(),
            "allow { glob.match(\"{{ inventory.facts.role }}\", [], input.agent) }\n".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let e = NodeTemplate::new(&rego, "")
        .unwrap()
        .render(&input("n1", r#"{"facts":{"role":"*"}}"#))
        .unwrap_err();
    assert_eq!(e.refused, Some(Place::OpaPolicy), "{e}");
}

#[test]
fn captured_blocks_and_vouched_rule_blocks_render_in_a_policy() {
    let t = |policy: &str| ConfigurationTemplate {
        configuration: [("a".to_string(), "b".to_string())].into(),
        action_policies: [("rpcutil.policy".to_string(), policy.to_string())].into(),
        values: [(
            "rules".to_string(),
            json!("allow\tchoria=ops\t*\t*\t*\nallow\tchoria=dev\tping\t*\t*"),
        )]
        .into(),
        ..Default::default()
    };
    // A block capture: its values were checked (and marked) inside it.
    let captured = NodeTemplate::new(
        &t("{% set who %}choria={{ inventory.facts.role }}{% endset %}policy default deny\nallow\t{{ who }}\t*\t*\t*\n"),
        "",
    )
    .unwrap();
    let r = captured
        .render(&input("n1", r#"{"facts":{"role":"web"}}"#))
        .unwrap();
    assert_eq!(
        r.action_policies["rpcutil.policy"],
        "policy default deny\nallow\tchoria=web\t*\t*\t*\n"
    );
    let e = captured
        .render(&input("n1", r#"{"facts":{"role":"/.*/"}}"#))
        .unwrap_err();
    assert_eq!(e.refused, Some(Place::ActionPolicy), "{e}");
    // A block of the author's own rules.
    let block = NodeTemplate::new(
        &t("policy default deny\n{{ values.rules | allow_line_breaks | allow_separators }}\n"),
        "",
    )
    .unwrap();
    let r = block.render(&input("n1", INVENTORY)).unwrap();
    assert!(r.action_policies["rpcutil.policy"].contains("allow\tchoria=ops\t*\t*\t*"));
    assert!(!r.action_policies["rpcutil.policy"]
        .chars()
        .any(|c| ('\u{E000}'..='\u{E002}').contains(&c)));
    // A value carrying a forged mark is refused.
    let plain = NodeTemplate::new(&t("allow\t{{ inventory.facts.role }}\t*\t*\t*\n"), "").unwrap();
    let e = plain
        .render(&input("n1", r#"{"facts":{"role":"x\uE001*"}}"#))
        .unwrap_err();
    assert_eq!(e.refused, Some(Place::ActionPolicy), "{e}");
}
