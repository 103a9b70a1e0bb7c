// Command choria is a test-only build of github.com/choria-io/go-choria's
// `choria` binary, used as a real peer by choria-provisioner-rs integration
// tests. It is what `go generate -run plugin` + `go build` produce in a
// go-choria checkout: the generated plugin_*.go files only do
// plugin.Register(name, pkg.ChoriaPlugin()) in an init(), for every entry of
// go-choria's packager/plugins.yaml, so we do the same here and then run the
// same entry point as go-choria's main.go.
//
// Build with scripts/build-go-peers.sh (it sets build.Version and
// build.ProvisionJWTFile via -ldflags -X; without ProvisionJWTFile the binary
// never enters provisioning mode).
package main

import (
	"os"

	"github.com/choria-io/go-choria/cmd"
	"github.com/choria-io/go-choria/plugin"
	log "github.com/sirupsen/logrus"

	// RPC providers
	externalmco "github.com/choria-io/go-choria/providers/agent/mcorpc/external"
	golangmco "github.com/choria-io/go-choria/providers/agent/mcorpc/golang"
	rubymco "github.com/choria-io/go-choria/providers/agent/mcorpc/ruby"

	// Agents
	choria_provision "github.com/choria-io/go-choria/providers/agent/mcorpc/golang/provision"
	choria_registry "github.com/choria-io/go-choria/providers/agent/mcorpc/golang/registry"
	scout "github.com/choria-io/go-choria/scout/agent/scout"

	// Autonomous Agent watchers
	archive_watcher "github.com/choria-io/go-choria/aagent/watchers/archivewatcher"
	ccmmanifest_watcher "github.com/choria-io/go-choria/aagent/watchers/ccmmanifestwatcher"
	exec_watcher "github.com/choria-io/go-choria/aagent/watchers/execwatcher"
	expression_watcher "github.com/choria-io/go-choria/aagent/watchers/expressionwatcher"
	file_watcher "github.com/choria-io/go-choria/aagent/watchers/filewatcher"
	gossip_watcher "github.com/choria-io/go-choria/aagent/watchers/gossipwatcher"
	httpswitch_watcher "github.com/choria-io/go-choria/aagent/watchers/httpswitchwatcher"
	kv_watcher "github.com/choria-io/go-choria/aagent/watchers/kvwatcher"
	metric_watcher "github.com/choria-io/go-choria/aagent/watchers/metricwatcher"
	nagios_watcher "github.com/choria-io/go-choria/aagent/watchers/nagioswatcher"
	plugins_watcher "github.com/choria-io/go-choria/aagent/watchers/pluginswatcher"
	schedule_watcher "github.com/choria-io/go-choria/aagent/watchers/schedulewatcher"
	timer_watcher "github.com/choria-io/go-choria/aagent/watchers/timerwatcher"

	// Data plugins
	machine_data "github.com/choria-io/go-choria/aagent/data/machinedata"
	choria_data "github.com/choria-io/go-choria/providers/data/golang/choriadata"
	config_item_data "github.com/choria-io/go-choria/providers/data/golang/configdata"
	scout_data "github.com/choria-io/go-choria/scout/data/scoutdata"
)

// plugins mirrors go-choria v0.30.2 packager/plugins.yaml, in the order the
// generator emits them (sorted by name).
var plugins = []struct {
	name string
	p    plugin.Pluggable
}{
	{"archive_watcher", archive_watcher.ChoriaPlugin()},
	{"ccmmanifest_watcher", ccmmanifest_watcher.ChoriaPlugin()},
	{"choria_data", choria_data.ChoriaPlugin()},
	{"choria_provision", choria_provision.ChoriaPlugin()},
	{"choria_registry", choria_registry.ChoriaPlugin()},
	{"config_item_data", config_item_data.ChoriaPlugin()},
	{"exec_watcher", exec_watcher.ChoriaPlugin()},
	{"expression_watcher", expression_watcher.ChoriaPlugin()},
	{"externalmco", externalmco.ChoriaPlugin()},
	{"file_watcher", file_watcher.ChoriaPlugin()},
	{"golangmco", golangmco.ChoriaPlugin()},
	{"gossip_watcher", gossip_watcher.ChoriaPlugin()},
	{"httpswitch_watcher", httpswitch_watcher.ChoriaPlugin()},
	{"kv_watcher", kv_watcher.ChoriaPlugin()},
	{"machine_data", machine_data.ChoriaPlugin()},
	{"metric_watcher", metric_watcher.ChoriaPlugin()},
	{"nagios_watcher", nagios_watcher.ChoriaPlugin()},
	{"plugins_watcher", plugins_watcher.ChoriaPlugin()},
	{"rubymco", rubymco.ChoriaPlugin()},
	{"schedule_watcher", schedule_watcher.ChoriaPlugin()},
	{"scout", scout.ChoriaPlugin()},
	{"scout_data", scout_data.ChoriaPlugin()},
	{"timer_watcher", timer_watcher.ChoriaPlugin()},
}

func init() {
	for _, pl := range plugins {
		if err := plugin.Register(pl.name, pl.p); err != nil {
			panic(err)
		}
	}
}

func main() {
	if err := cmd.ParseCLI(); err != nil {
		log.Fatalf("Could not configure Choria: %s", err.Error())
		os.Exit(1)
	}

	if err := cmd.Run(); err != nil {
		log.Fatalf("Could not run Choria: %s", err.Error())
		os.Exit(1)
	}
}
