// Builds the real Go provisioner (github.com/choria-io/provisioner) as a test
// peer: scripts/build-go-peers.sh runs
//   go build -o "$CACHE_BIN/choria-go-provisioner" github.com/choria-io/provisioner
// in this directory. The `tool` directive keeps the requirement alive under
// `go mod tidy` (a main package cannot be imported from a tools.go).
//
// Status: the Go module proxy reachable from this project answers
// "403 Forbidden / This module version is not available" for every version of
// github.com/choria-io/provisioner, so there is no go.sum yet; run
// `go mod tidy` here once the module is served.
module choria-provisioner-rs/tests/gopeers/provisioner

go 1.25.0

tool github.com/choria-io/provisioner

require (
	github.com/choria-io/provisioner v0.16.0
	// provisioner v0.16.0 asks for go-choria v0.30.0, which the proxy serves
	// without a checksum database entry; pin the same release as ../choria.
	github.com/choria-io/go-choria v0.30.2
)

// github.com/choria-io/appbuilder is not served either; see ../appbuilder-stub.
replace github.com/choria-io/appbuilder => ../appbuilder-stub
