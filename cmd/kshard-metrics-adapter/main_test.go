package main

import (
	"testing"

	"github.com/kshard/kshard/cmd/kshard-metrics-adapter/internal/custommetrics"
)

// TestFlags: the defaults a pod with a read-only root file system and no
// capabilities needs (a port above 1024, the serving certificate in
// memory), and the provider's flags reaching its options.
func TestFlags(t *testing.T) {
	a := newAdapter()
	if err := a.FlagSet.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if a.SecureServing.BindPort != defaultSecurePort || a.SecureServing.ServerCert.CertDirectory != "" {
		t.Errorf("secure port %d, cert dir %q: want %d and none (in memory)", a.SecureServing.BindPort, a.SecureServing.ServerCert.CertDirectory, defaultSecurePort)
	}
	if a.opts.Period != custommetrics.DefaultPeriod || a.opts.Metric != custommetrics.DefaultMetric || a.tlsVerify != string(custommetrics.TLSVerifyAuto) {
		t.Errorf("defaults %+v, TLS verification %q", a.opts, a.tlsVerify)
	}

	a = newAdapter()
	err := a.FlagSet.Parse([]string{"--namespace=ring", "--scrape-tls-verify=skip", "--scrape-tls-verify=verify",
		"--scrape-ca-file=/ca.crt", "--scrape-period=30s", "--pod-selector=app=x", "--secure-port=7443"})
	if err != nil {
		t.Fatal(err)
	}
	if a.opts.Namespace != "ring" || a.tlsVerify != "verify" || a.opts.CAFile != "/ca.crt" || a.opts.Period.String() != "30s" ||
		a.selector != "app=x" || a.SecureServing.BindPort != 7443 {
		t.Errorf("parsed %+v, selector %q, TLS verification %q (the last of a repeated flag wins)", a.opts, a.selector, a.tlsVerify)
	}
}
