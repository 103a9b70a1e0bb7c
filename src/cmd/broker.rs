//! The broker options of the commands that dial like a provisioning-mode
//! server (`fleet`, `discover`), flattened into each.

use choria_wire::client::{BrokerOptions, DEFAULT_NATS};
use std::path::PathBuf;

/// The command line of [`BrokerOptions`]: URLs and TLS, no credentials.
#[derive(Clone, Debug, clap::Args)]
pub struct BrokerArgs {
    /// NATS server URL(s); repeat or separate with commas.
    #[arg(long, default_value = DEFAULT_NATS, value_delimiter = ',')]
    pub nats: Vec<String>,
    /// Verify the broker's TLS certificate against this CA (otherwise TLS, when
    /// used, does not verify, like a provisioning-mode server).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Always use TLS.
    #[arg(long)]
    pub tls_required: bool,
}

impl From<BrokerArgs> for BrokerOptions {
    fn from(args: BrokerArgs) -> Self {
        let BrokerArgs {
            nats,
            tls_ca,
            tls_required,
        } = args;
        BrokerOptions {
            nats,
            tls_ca,
            tls_required,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        broker: BrokerArgs,
    }

    fn options(line: &[&str]) -> BrokerOptions {
        let argv = std::iter::once("broker").chain(line.iter().copied());
        Cli::try_parse_from(argv).unwrap().broker.into()
    }

    #[test]
    fn the_empty_command_line_is_the_default() {
        assert_eq!(options(&[]), BrokerOptions::default());
    }

    #[test]
    fn urls_repeat_or_are_separated_with_commas() {
        let o = options(&[
            "--nats",
            "nats://a:4222,nats://b:4222",
            "--nats",
            "tls://c:4222",
            "--tls-ca",
            "ca.pem",
            "--tls-required",
        ]);
        assert_eq!(o.nats, ["nats://a:4222", "nats://b:4222", "tls://c:4222"]);
        assert_eq!(o.tls_ca, Some(PathBuf::from("ca.pem")));
        assert!(o.tls_required);
    }
}
