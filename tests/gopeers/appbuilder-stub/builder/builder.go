// Package builder is a minimal, non-functional stand-in for
// github.com/choria-io/appbuilder/builder; see ../go.mod.
package builder

import (
	"context"
	"encoding/json"
	"errors"
	"sync"

	"github.com/choria-io/fisk"
)

// ErrUnavailable is returned by every operation of this stand-in.
var ErrUnavailable = errors.New("appbuilder is not available in this test build of choria")

// Logger is the logging interface handed to commands.
type Logger interface {
	Debugf(format string, v ...any)
	Infof(format string, v ...any)
	Warnf(format string, v ...any)
	Errorf(format string, v ...any)
}

// KingpinCommand is something that can have sub commands added.
type KingpinCommand interface {
	Command(name string, help string) *fisk.CmdClause
}

// Command is an app builder command implementation.
type Command interface {
	CreateCommand(app KingpinCommand) (*fisk.CmdClause, error)
	SubCommands() []json.RawMessage
	Validate(Logger) error
	String() string
}

// CommandConstructor creates a Command from its JSON definition.
type CommandConstructor func(*AppBuilder, json.RawMessage, Logger) (Command, error)

var (
	mu       sync.Mutex
	registry = map[string]CommandConstructor{}
)

// RegisterCommand records a command type.
func RegisterCommand(name string, f CommandConstructor) error {
	mu.Lock()
	defer mu.Unlock()
	registry[name] = f
	return nil
}

// MustRegisterCommand records a command type, panicking on error.
func MustRegisterCommand(name string, f CommandConstructor) {
	if err := RegisterCommand(name, f); err != nil {
		panic(err)
	}
}

// GenericCommand holds the fields common to all commands.
type GenericCommand struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Aliases     []string          `json:"aliases"`
	Type        string            `json:"type"`
	Arguments   []GenericArgument `json:"arguments"`
	Flags       []GenericFlag     `json:"flags"`
}

// Validate always fails in this stand-in.
func (c *GenericCommand) Validate(Logger) error { return ErrUnavailable }

// GenericSubCommands holds nested command definitions.
type GenericSubCommands struct {
	Commands []json.RawMessage `json:"commands"`
}

// GenericArgument is a positional argument definition.
type GenericArgument struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Required    bool     `json:"required"`
	Enum        []string `json:"enum"`
	Default     string   `json:"default"`
}

// GenericFlag is a flag definition.
type GenericFlag struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Required    bool     `json:"required"`
	PlaceHolder string   `json:"placeholder"`
	Enum        []string `json:"enum"`
	Default     any      `json:"default"`
	Bool        bool     `json:"bool"`
	EnvVar      string   `json:"env"`
	Short       string   `json:"short"`
}

// Transform is an output transformation definition.
type Transform struct{}

// Validate always fails in this stand-in.
func (t *Transform) Validate(Logger) error { return ErrUnavailable }

// TransformBytes always fails in this stand-in.
func (t *Transform) TransformBytes(ctx context.Context, r []byte, args map[string]any, flags map[string]any, b *AppBuilder) ([]byte, error) {
	return nil, ErrUnavailable
}

// AppBuilder is the application builder.
type AppBuilder struct {
	ctx context.Context
}

// Option configures an AppBuilder.
type Option func(*AppBuilder) error

// WithConfigPaths is accepted and ignored.
func WithConfigPaths(paths ...string) Option { return func(*AppBuilder) error { return nil } }

// WithContextualUsageOnError is accepted and ignored.
func WithContextualUsageOnError() Option { return func(*AppBuilder) error { return nil } }

// New creates an AppBuilder that can do nothing.
func New(ctx context.Context, name string, opts ...Option) (*AppBuilder, error) {
	return &AppBuilder{ctx: ctx}, nil
}

// Configuration returns no configuration.
func (b *AppBuilder) Configuration() any { return nil }

// Context returns the builder context.
func (b *AppBuilder) Context() context.Context { return b.ctx }

// CreateBuilderApp adds nothing.
func (b *AppBuilder) CreateBuilderApp(cmd KingpinCommand) {}

// CreateGenericCommand creates a plain sub command.
func CreateGenericCommand(app KingpinCommand, sc *GenericCommand, arguments map[string]any, flags map[string]any, b *AppBuilder, cb fisk.Action) *fisk.CmdClause {
	return app.Command(sc.Name, sc.Description).Action(cb)
}

// ParseStateTemplate always fails in this stand-in.
func ParseStateTemplate(body string, args any, flags any, cfg any) (string, error) {
	return "", ErrUnavailable
}

// RunStandardCLI always fails in this stand-in.
func RunStandardCLI(ctx context.Context, name string, watchInterrupts bool, cmd *fisk.Application, opts ...Option) error {
	return ErrUnavailable
}

// RunTaskCLI always fails in this stand-in.
func RunTaskCLI(ctx context.Context, watchInterrupts bool, opts ...Option) error {
	return ErrUnavailable
}
