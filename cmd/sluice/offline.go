package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/sluiceproxy/sluice/pkg/app"
	"github.com/sluiceproxy/sluice/pkg/config"
	"github.com/sluiceproxy/sluice/pkg/explain"
	"github.com/sluiceproxy/sluice/pkg/model"
)

// offlineFlags describe a node without asking it anything: the API objects (files as
// `kubectl get -o yaml` prints them), the node's name, and the configuration. explain -f
// and render share them; each command names the file and mode flags its own way.
type offlineFlags struct {
	files        []string
	node         string
	mode         string
	configFile   string
	clusterCIDR  string
	nodePortAddr []string
	detectLocal  string
	masqAll      bool
}

// addConfigFlags registers the configuration flags; help is prefixed with prefix.
func (f *offlineFlags) addConfigFlags(fs *pflag.FlagSet, prefix string) {
	fs.StringVar(&f.configFile, "config", "", prefix+"a KubeProxyConfiguration file, as the daemon's --config (the flags below override it)")
	fs.StringVar(&f.clusterCIDR, "cluster-cidr", "", prefix+"clusterCIDR, which recognises pod traffic (overrides --config)")
	fs.StringSliceVar(&f.nodePortAddr, "nodeport-addresses", nil, prefix+"nodePortAddresses (overrides --config)")
	fs.StringVar(&f.detectLocal, "detect-local-mode", "", prefix+"detectLocalMode (overrides --config)")
	fs.BoolVar(&f.masqAll, "masquerade-all", false, prefix+"masqueradeAll (overrides --config)")
}

// configFlagsSet reports whether any flag describing the node or its configuration is set.
func (f *offlineFlags) configFlagsSet() bool {
	return f.node != "" || f.configFile != "" || f.mode != "" || f.clusterCIDR != "" || f.nodePortAddr != nil || f.detectLocal != "" || f.masqAll
}

// offlineNode is one node's state computed from API objects as the daemon computes it.
type offlineNode struct {
	name string
	node model.NodeInfo
	// states holds one NodeState per family.
	states map[model.IPFamily]*model.NodeState
	eff    *config.Effective
}

// loadOffline reads the files ("-" is stdin), picks the node (--node, or the only Node in
// the files), completes the configuration as the daemon does (file, flags over it,
// defaults, validation) and computes the node's state.
func loadOffline(f *offlineFlags, stdin io.Reader) (*offlineNode, error) {
	objs := &explain.Objects{}
	for _, path := range f.files {
		got, err := decodeFile(path, stdin)
		if err != nil {
			return nil, err
		}
		objs.Services = append(objs.Services, got.Services...)
		objs.EndpointSlices = append(objs.EndpointSlices, got.EndpointSlices...)
		objs.Nodes = append(objs.Nodes, got.Nodes...)
		objs.ServiceCIDRs = append(objs.ServiceCIDRs, got.ServiceCIDRs...)
	}
	nodeName := f.node
	if nodeName == "" {
		if len(objs.Nodes) != 1 {
			return nil, fmt.Errorf("--node is required: the files hold %d Nodes (%s)", len(objs.Nodes), nodeNames(objs))
		}
		nodeName = objs.Nodes[0].Name
	}
	node := objs.Node(nodeName)
	if node == nil {
		return nil, fmt.Errorf("no Node %q in the files (Nodes: %s); add it: kubectl get node %s -o yaml", nodeName, nodeNames(objs), nodeName)
	}

	cfg := &v1alpha1.KubeProxyConfiguration{}
	if f.configFile != "" {
		var err error
		if cfg, err = config.LoadFile(f.configFile); err != nil {
			return nil, err
		}
	}
	if f.mode != "" {
		cfg.Mode = v1alpha1.ProxyMode(f.mode)
	}
	if f.clusterCIDR != "" {
		cfg.ClusterCIDR = f.clusterCIDR
	}
	if f.nodePortAddr != nil {
		cfg.NodePortAddresses = f.nodePortAddr
	}
	if f.detectLocal != "" {
		cfg.DetectLocalMode = v1alpha1.LocalMode(f.detectLocal)
	}
	if f.masqAll {
		cfg.IPTables.MasqueradeAll, cfg.NFTables.MasqueradeAll = true, true
	}
	config.SetDefaults(cfg)
	modeDefaulted := config.ApplyPlatformDefaults(cfg)
	if errs := config.Validate(cfg); len(errs) > 0 {
		return nil, fmt.Errorf("configuration: %w", errs.ToAggregate())
	}
	eff, err := config.NewEffective(cfg, nodeName)
	if err != nil {
		return nil, err
	}
	eff.ModeDefaulted = modeDefaulted

	// As the daemon: externalIPs are dropped when the AllowServiceExternalIPs gate is off.
	allowExternalIPs, set := cfg.FeatureGates[string(config.AllowServiceExternalIPs)]
	opts := model.Options{IgnoreExternalIPs: set && !allowExternalIPs}
	info := app.NodeInfoOf(node)
	return &offlineNode{
		name:   nodeName,
		node:   info,
		states: model.Compute(objs.Services, objs.EndpointSlices, info, objs.ServiceCIDRPrefixes(), opts),
		eff:    eff,
	}, nil
}

// decodeFile reads the API objects of one file, or of stdin for "-".
func decodeFile(path string, stdin io.Reader) (*explain.Objects, error) {
	r := stdin
	if path != "-" {
		file, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		r = file
	}
	objs, err := explain.DecodeObjects(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

func nodeNames(objs *explain.Objects) string {
	var names []string
	for _, n := range objs.Nodes {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
