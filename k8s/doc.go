// Package k8s is dlock's driver for Kubernetes coordination.k8s.io/v1 Lease
// objects, through k8s.io/client-go. Importing it registers the DSN scheme
// "k8s" with dlock.Open:
//
//	import _ "github.com/dlock-go/dlock/k8s"
//
//	locker, err := dlock.Open(ctx, "k8s://my-namespace/locks-")
//
// To use a clientset built in code, call [New] or [NewDriver].
//
// A lock is the Lease [LeaseName] in the DSN's namespace, taken and renewed
// with updates conditional on the resourceVersion read (a create for an
// absent Lease); a release clears the holder and keeps the Lease. The
// fencing token is the Lease's creation second in the high 32 bits and its
// leaseTransitions, which every grant increments, in the low ones; it
// increases strictly across holders, releases, and deletes of the Lease
// ([backend.FencingStrict]). A holder's Lease expires, as client-go's leader
// election judges it, its leaseDurationSeconds after a waiter first saw its
// last write: only clock rates must agree. Waiters and holders watch the
// Lease; waiters are not served in order. The holderIdentity is the holder's
// label (its owner ID without one), so client-go's leader election and
// kubectl show it, and the two exclude each other on the same Lease.
//
// DSN: k8s://namespace[/prefix], with the parameters kubeconfig (a path),
// context, request-timeout and poll (5s each). Without kubeconfig, the
// client configuration is found as kubectl finds it ($KUBECONFIG,
// ~/.kube/config), else in-cluster (the pod's service account). Credentials
// never appear in the DSN. docs/k8s.md has the whole write-up: layout,
// token, expiry, failure cases.
package k8s
