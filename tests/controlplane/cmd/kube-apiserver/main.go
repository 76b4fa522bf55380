// Command kube-apiserver is Kubernetes' kube-apiserver, built from the pinned k8s.io/kubernetes module for idem's local control plane.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
