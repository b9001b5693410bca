// Command etcd is upstream etcd, built from the pinned module version so that
// kshard's tests and sandbox run the same storage as a real control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
