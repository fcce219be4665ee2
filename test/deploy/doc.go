// Package deploy tests what operators install: the manifests and kustomizations under
// deploy/, the Dockerfile, and the observability kit (dashboard, alerts, PodMonitor).
//
// Without a build tag the tests are unit tests: every YAML file decodes strictly, the
// kustomizations render and their DaemonSets run sluice with a configuration sluice accepts,
// every metric the dashboard and alerts query is one sluice exports, and the image installs
// the programs sluice executes. With -tags e2e they also apply the base and the
// replace-kube-proxy overlay to a real kube-apiserver (test/framework/controlplane) and check
// what it stored, check the ServiceAccounts' permissions with the API server's own
// authorizer, and build the binary exactly as the Dockerfile does.
package deploy
