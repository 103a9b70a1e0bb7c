// Command natstap is a raw NATS subscriber used to capture wire traffic
// between real Choria peers (test vectors for choria-provisioner-rs).
//
// Every message on the given subjects (default ">") is printed to stdout as
// one JSON object per line:
//
//	{"time":"...","subject":"...","reply":"...","headers":{...},"size":N,"data":"<raw bytes as string>"}
//
// "data" holds the payload exactly as received (JSON-escaped); "data_b64" is
// used instead when the payload is not valid UTF-8.
//
//	natstap [--server nats://127.0.0.1:4222] [--count N] [subject ...]
//
// It connects in plaintext (the test nats-server has allow_non_tls: true).
package main

import (
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

type record struct {
	Time    string              `json:"time"`
	Subject string              `json:"subject"`
	Reply   string              `json:"reply,omitempty"`
	Headers map[string][]string `json:"headers,omitempty"`
	Size    int                 `json:"size"`
	Data    *string             `json:"data,omitempty"`
	DataB64 string              `json:"data_b64,omitempty"`
}

func main() {
	server := flag.String("server", "nats://127.0.0.1:4222", "NATS URL")
	count := flag.Int("count", 0, "exit after this many messages (0: run until killed)")
	flag.Parse()

	subjects := flag.Args()
	if len(subjects) == 0 {
		subjects = []string{">"}
	}

	nc, err := nats.Connect(*server, nats.Name("natstap"), nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintf(os.Stderr, "natstap: connect %s: %v\n", *server, err)
		os.Exit(1)
	}
	defer nc.Close()

	msgs := make(chan *nats.Msg, 10000)
	for _, s := range subjects {
		if _, err := nc.ChanSubscribe(s, msgs); err != nil {
			fmt.Fprintf(os.Stderr, "natstap: subscribe %s: %v\n", s, err)
			os.Exit(1)
		}
	}
	if err := nc.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "natstap: flush: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "natstap: listening on %v at %s\n", subjects, *server)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)

	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	seen := 0
	for {
		select {
		case <-sigs:
			return
		case m := <-msgs:
			r := record{
				Time:    time.Now().UTC().Format(time.RFC3339Nano),
				Subject: m.Subject,
				Reply:   m.Reply,
				Size:    len(m.Data),
			}
			if len(m.Header) > 0 {
				r.Headers = m.Header
			}
			if utf8.Valid(m.Data) {
				s := string(m.Data)
				r.Data = &s
			} else {
				r.DataB64 = base64.StdEncoding.EncodeToString(m.Data)
			}
			if err := enc.Encode(r); err != nil {
				fmt.Fprintf(os.Stderr, "natstap: %v\n", err)
				os.Exit(1)
			}
			seen++
			if *count > 0 && seen >= *count {
				return
			}
		}
	}
}
