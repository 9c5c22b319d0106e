// Command kube-apiserver is Kubernetes' API server, built from the module
// proxy for dlock's tests of the k8s driver (internal/testenv.KubeAPIServer).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
