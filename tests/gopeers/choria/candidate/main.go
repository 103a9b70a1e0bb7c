// Command candidate is a Go election candidate that campaigns exactly as the
// Go provisioner (github.com/choria-io/provisioner, hosts/election.go) does,
// for tests of choria-provisioner-rs's election against the real Go code.
// That module cannot be built here, but its election is only go-choria's:
//
//	fw.NewElection(ctx, conn, "provisioner", true,
//	    election.OnWon(won), election.OnLost(lost),
//	    election.WithBackoff(backoff.TwentySec), election.WithDebug(log.Debugf))
//
// and go-choria's Framework.NewElectionWithConn is reproduced below on a
// plain nats.go connection (the framework needs a full Choria config and
// security provider, which add nothing to the election itself).
//
// One JSON line per transition goes to stdout, flushed at once:
//
//	{"time_us":<unix micros>,"identity":"...","state":"leader"|"follower"}
//
// "follower" is printed once at start. The times are taken inside the
// OnWon/OnLost callbacks, i.e. when the Go provisioner would resume or pause.
//
//	candidate --server nats://127.0.0.1:4222 --identity go1.example.net [--imported=true] [--name provisioner] [--debug]
//
// SIGTERM or SIGINT cancel the election's context and exit 0; like the Go
// provisioner, the key is not deleted (it expires with the bucket TTL).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/choria-io/go-choria/backoff"
	election "github.com/choria-io/go-choria/providers/election/streams"
	"github.com/nats-io/nats.go"
)

type transition struct {
	TimeUS   int64  `json:"time_us"`
	Identity string `json:"identity"`
	State    string `json:"state"`
}

var outMu sync.Mutex

// report writes straight to os.Stdout (unbuffered), so a line is visible to
// the test as soon as the callback runs.
func report(identity, state string) {
	outMu.Lock()
	defer outMu.Unlock()
	line, _ := json.Marshal(transition{TimeUS: time.Now().UnixMicro(), Identity: identity, State: state})
	os.Stdout.Write(append(line, '\n'))
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "candidate: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	server := flag.String("server", "nats://127.0.0.1:4222", "NATS URL")
	identity := flag.String("identity", "", "candidate identity (the value written to the key)")
	imported := flag.Bool("imported", true, "use the choria.streams API prefix, as the Go provisioner does")
	name := flag.String("name", "provisioner", "election name (the key in CHORIA_LEADER_ELECTION)")
	debug := flag.Bool("debug", false, "print the election's debug messages to stderr")
	flag.Parse()
	if *identity == "" {
		fail("--identity is required")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	nc, err := nats.Connect(*server, nats.Name(fmt.Sprintf("election %s %s", *name, *identity)), nats.MaxReconnects(-1))
	if err != nil {
		fail("connect %s: %v", *server, err)
	}
	defer nc.Close()

	// From go-choria choria/framework.go NewElectionWithConn.
	var jsopt []nats.JSOpt
	if *imported {
		jsopt = append(jsopt, nats.APIPrefix("choria.streams"))
	}
	js, err := nc.JetStream(jsopt...)
	if err != nil {
		fail("cannot connect to Choria Streams: %s", err)
	}
	kv, err := js.KeyValue("CHORIA_LEADER_ELECTION")
	if err != nil {
		fail("cannot access KV Bucket CHORIA_LEADER_ELECTION: %v", err)
	}

	opts := []election.Option{
		election.OnWon(func() { report(*identity, "leader") }),
		election.OnLost(func() { report(*identity, "follower") }),
		election.WithBackoff(backoff.TwentySec),
	}
	if *debug {
		opts = append(opts, election.WithDebug(func(format string, a ...any) {
			fmt.Fprintf(os.Stderr, "%s %s: %s\n", time.Now().Format("15:04:05.000000"), *identity, fmt.Sprintf(format, a...))
		}))
	}
	elect, err := election.NewElection(*identity, *name, kv, opts...)
	if err != nil {
		fail("election: %v", err)
	}

	report(*identity, "follower")

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
	}()

	// Start blocks until ctx is cancelled; the Go provisioner treats an error
	// here (bucket unreachable at start) as fatal, and so do we.
	if err := elect.Start(ctx); err != nil && ctx.Err() == nil {
		fail("leader election failed to start: %s", err)
	}
}
