//! The `rpcutil` agent: `inventory` as a provisioning-mode go-choria server answers it.

use super::*;

impl Node {
    pub(super) fn rpcutil(&self, action: &str) -> Handled {
        match action {
            "inventory" => {
                let own;
                let facts = match &self.shared.evidence {
                    Some(e) => match e.facts(&self.identity, &self.shared.facts) {
                        Ok(f) => {
                            own = f;
                            &own
                        }
                        Err(e) => return self.abort(action, format!("evidence: {e}")),
                    },
                    None => &self.shared.facts,
                };
                #[derive(Serialize)]
                struct Inventory<'a> {
                    agents: &'a [&'a str],
                    classes: [(); 0],
                    collectives: [&'a str; 1],
                    data_plugins: [(); 0],
                    facts: &'a serde_json::Value,
                    machines: [(); 0],
                    main_collective: &'a str,
                    version: &'a str,
                    upgradable: bool,
                }
                self.reply_ok(
                    action,
                    &Inventory {
                        agents: AGENTS,
                        classes: [],
                        collectives: ["provisioning"],
                        data_plugins: [],
                        facts,
                        machines: [],
                        main_collective: "provisioning",
                        version: &self.version,
                        upgradable: self.shared.upgradable,
                    },
                )
            }
            "ping" => {
                #[derive(Serialize)]
                struct Pong {
                    pong: i64,
                }
                self.reply_ok(
                    action,
                    &Pong {
                        pong: chrono::Utc::now().timestamp(),
                    },
                )
            }
            "collective_info" => {
                #[derive(Serialize)]
                struct Info<'a> {
                    main_collective: &'a str,
                    collectives: [&'a str; 1],
                }
                self.reply_ok(
                    action,
                    &Info {
                        main_collective: "provisioning",
                        collectives: ["provisioning"],
                    },
                )
            }
            other => self.reply_error(
                other,
                StatusCode::UnknownAction,
                format!("Unknown action {other} for agent rpcutil"),
            ),
        }
    }
}
