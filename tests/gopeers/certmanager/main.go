// cert-manager-controller: the real cert-manager controllers (the packages of
// github.com/cert-manager/cert-manager at the version in go.mod), only the
// ones the integration tests and the node tier's quick start need (a CA made
// by a self-signed Certificate, CertificateRequests signed by the CA issuer),
// for a bare test control plane (etcd + kube-apiserver, no kubelet) or the
// node tier's cluster. Built by `scripts/build-kube-peers.sh cert-manager`;
// tests/it/cert_manager.rs and scripts/node-tier/quick-start.sh run it.
//
// cert-manager's own cmd/controller is a separate module the Go module proxy
// does not serve, so this wrapper does what its app does for the controllers
// below: one controller ContextFactory, each controller built from the
// package's registered constructor, then the shared informers started and
// every controller run. It has no leader election, webhook, metrics/health
// server or ACME.
//
//	cert-manager-controller --kubeconfig FILE [--controllers a,b] \
//	    [--cluster-resource-namespace NS] [--namespace NS] [--feature-gates k=v] [-v N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	// Each registers its controller with controllerpkg.Register.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"   // certificaterequests-approver
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"         // certificaterequests-issuer-ca
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned" // certificaterequests-issuer-selfsigned
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"                        // issuers
	// A Certificate's life: a key, a CertificateRequest, its Secret, its
	// Ready condition, renewal, old requests pruned (the quick start on
	// Kubernetes makes its CA with one, scripts/node-tier/quick-start.sh).
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"         // certificates-issuing
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"      // certificates-key-manager
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"       // certificates-readiness
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"  // certificates-request-manager
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager" // certificates-revision-manager
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"         // certificates-trigger
	// The issuer types for the issuers controller (Issuer Ready condition).
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers compiled in, in start order; all run by default.
var available = []string{
	"issuers", "certificaterequests-approver", "certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned", "certificates-trigger", "certificates-key-manager",
	"certificates-request-manager", "certificates-issuing", "certificates-readiness",
	"certificates-revision-manager",
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server (empty: in-cluster)")
	master := flag.String("master", "", "API server address, overriding the kubeconfig's")
	controllers := flag.String("controllers", strings.Join(available, ","), "comma-separated controllers to run, of: "+strings.Join(available, ", "))
	clusterNS := flag.String("cluster-resource-namespace", "kube-system", "namespace of the Secrets of cluster-scoped issuers")
	namespace := flag.String("namespace", "", "only watch this namespace (empty: all)")
	workers := flag.Int("concurrent-workers", 5, "workers per controller")
	qps := flag.Float64("kube-api-qps", 20, "client QPS when the API server has no API Priority and Fairness")
	burst := flag.Int("kube-api-burst", 50, "client burst when the API server has no API Priority and Fairness")
	gates := flag.String("feature-gates", "", "cert-manager controller feature gates, k=v,...")
	klog.InitFlags(flag.CommandLine) // -v N (cert-manager: 2 info, 4 debug)
	flag.Parse()

	if err := run(*kubeconfig, *master, *controllers, *clusterNS, *namespace, *workers, float32(*qps), *burst, *gates); err != nil {
		fmt.Fprintf(os.Stderr, "cert-manager-controller: %v\n", err)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func run(kubeconfig, master, controllers, clusterNS, namespace string, workers int, qps float32, burst int, gates string) error {
	logf.InitLogs()
	if gates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(gates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	var names []string
	for n := range strings.SplitSeq(controllers, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.Contains(available, n) {
			return fmt.Errorf("unknown controller %q (compiled in: %s)", n, strings.Join(available, ", "))
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return fmt.Errorf("no controllers to run")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := logf.Log
	ctx = logf.NewContext(ctx, log)

	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		APIServerHost:      master,
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   qps,
		KubernetesAPIBurst: burst,
		Namespace:          namespace,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: clusterNS},
	})
	if err != nil {
		return err
	}

	// Building a controller registers the informers it needs with the shared
	// factories, so they are started after every controller is built.
	built := make(map[string]controllerpkg.Interface, len(names))
	for _, n := range names {
		c, err := controllerpkg.Known()[n](factory)
		if err != nil {
			return fmt.Errorf("building controller %s: %w", n, err)
		}
		built[n] = c
	}
	shared, err := factory.Build("informers")
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())

	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	for _, n := range names {
		wg.Go(func() {
			if err := built[n].Run(workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", n, err)
				stop()
			}
		})
	}
	log.Info("started cert-manager controllers", "controllers", names, "clusterResourceNamespace", clusterNS)
	wg.Wait()
	close(errs)
	return <-errs // nil when every controller ended on SIGTERM/SIGINT
}
