package main

import (
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// loadConfig reads a kubeconfig by the usual rules (an explicit path, then
// in-cluster, $KUBECONFIG and ~/.kube/config). Like ctrl.GetConfig, it turns
// client-side throttling off unless the kubeconfig sets it: the API server's
// priority and fairness is the limit.
func loadConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	if cfg.QPS == 0 {
		cfg.QPS = -1
	}
	return cfg, nil
}

// flagSetOf collects Go flags that a library binds (zap's logging flags) into
// a set that cobra can adopt.
func flagSetOf(bind func(*flag.FlagSet)) *flag.FlagSet {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	bind(fs)
	return fs
}
