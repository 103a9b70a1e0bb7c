// Package parent is a stand-in for github.com/choria-io/appbuilder/commands/parent; see ../../go.mod.
package parent

// Register does nothing.
func Register() error { return nil }
