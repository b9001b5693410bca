// Package childproc builds, starts and stops the child processes of the
// sandbox, the load tester and the tests (kshard replicas, the config
// center), and treats them the way a kubelet would treat a pod: each child
// in its own process group, so a signal reaches everything it started, and,
// on Linux, killed by the kernel when its parent dies, so an interrupted run
// leaves nothing behind.
package childproc
