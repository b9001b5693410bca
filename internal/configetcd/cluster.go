package configetcd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kshard/kshard/externalcache/etcdsource"
)

// The names deploy/config-etcd gives the etcd's Service, and the Secret of
// the client certificate the replicas present (hack/etcdcert writes it).
const (
	ClusterService = "config-etcd"
	ClientSecret   = "kshard-etcd-client"
)

// Cluster is deploy/config-etcd's etcd as seen from outside its cluster's
// pods: the load tester and the end-to-end suite seed it, change its values
// and read its metrics, as the replicas' client does, over TLS with the
// replicas' client certificate.
type Cluster struct {
	// Client is connected to the etcd; the caller closes it.
	Client *clientv3.Client
	// Endpoint is the client URL, https://<cluster IP>:<client port>.
	Endpoint string
	// Metrics is the host:port of its plain-HTTP /metrics.
	Metrics string
}

// ConnectCluster connects to the etcd of deploy/config-etcd in namespace, at
// its Service's cluster IP (the node of `make cluster` routes the Service
// range to the host), with the client certificate of Secret ClientSecret,
// written into dir for the client to read.
func ConnectCluster(ctx context.Context, cs kubernetes.Interface, namespace, dir string) (*Cluster, error) {
	svc, err := cs.CoreV1().Services(namespace).Get(ctx, ClusterService, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("finding the config center (Service %s/%s, as deploy/config-etcd installs it): %w", namespace, ClusterService, err)
	}
	if svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil, fmt.Errorf("Service %s/%s has no cluster IP", namespace, ClusterService)
	}
	ports := map[string]int32{}
	for _, p := range svc.Spec.Ports {
		ports[p.Name] = p.Port
	}
	if ports["client"] == 0 || ports["metrics"] == 0 {
		return nil, fmt.Errorf("Service %s/%s lacks the ports named client and metrics", namespace, ClusterService)
	}
	secret, err := cs.CoreV1().Secrets(namespace).Get(ctx, ClientSecret, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the config center's client certificate (Secret %s/%s, from hack/etcdcert): %w", namespace, ClientSecret, err)
	}
	files := map[string]string{}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(secret.Data[k]) == 0 {
			return nil, fmt.Errorf("Secret %s/%s has no %s", namespace, ClientSecret, k)
		}
		files[k] = filepath.Join(dir, k)
		if err := os.WriteFile(files[k], secret.Data[k], 0o600); err != nil {
			return nil, fmt.Errorf("writing the config center's client certificate: %w", err)
		}
	}
	c := &Cluster{
		Endpoint: "https://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(ports["client"]))),
		Metrics:  net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(ports["metrics"]))),
	}
	if c.Client, err = etcdsource.NewClient(etcdsource.ClientOptions{Servers: []string{c.Endpoint},
		CAFile: files["ca.crt"], CertFile: files["tls.crt"], KeyFile: files["tls.key"]}); err != nil {
		return nil, fmt.Errorf("connecting to the config center at %s: %w", c.Endpoint, err)
	}
	return c, nil
}
