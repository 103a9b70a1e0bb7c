//! The `choria-provisioner` binary. The command line lives in
//! [`choria_provisioner::cmd`], one file per subcommand.

fn main() -> std::process::ExitCode {
    choria_provisioner::cmd::main()
}
