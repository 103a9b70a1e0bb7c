// Stand-in for github.com/choria-io/appbuilder, which the Go module proxy
// reachable from this project refuses to serve ("403 This module version is
// not available", every version). go-choria's `cmd` package imports it only
// for the optional "app builder" feature (running choria under another
// argv[0] name, `choria tool builder`, `abt`), which our tests never use.
// This module only has the API surface that go-choria v0.30.2 compiles
// against; every entry point returns an error. It is wired in with a
// `replace` directive in ../choria/go.mod.
module github.com/choria-io/appbuilder

go 1.25.0

require github.com/choria-io/fisk v0.9.0
