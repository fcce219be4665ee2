// Package health serves the proxy's health checks: the proxy health server (/healthz and
// /livez on healthzBindAddress, for kubelet probes and cloud load balancers that check
// the whole node) and the per-Service health servers on each healthCheckNodePort (for
// cloud load balancers in front of LoadBalancer Services with externalTrafficPolicy
// Local).
//
// The rules and the JSON bodies are those of upstream kube-proxy, so that existing probes,
// load balancers and dashboards keep working; README.md has the table.
package health
