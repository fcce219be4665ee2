package nftables

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sluiceproxy/sluice/pkg/hostnet"
)

// skipKernelCheckEnv is upstream's switch for running on kernels older than 5.13 at the
// operator's own risk; honouring the same name keeps existing deployments working.
const skipKernelCheckEnv = "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK"

// checkKernel enforces upstream's minimum: kernel 5.13, whose nf_tables has everything
// this table uses and whose distributions ship an nft(8) that can read it
// (https://issues.k8s.io/122743).
func checkKernel(v hostnet.KernelVersion) error {
	if v.AtLeast(5, 13) || os.Getenv(skipKernelCheckEnv) != "" {
		return nil
	}
	return fmt.Errorf("nftables mode needs Linux 5.13 or later, this is %v (set %s=1 to try anyway)", v, skipKernelCheckEnv)
}

// checkNFTables asks nf_tables for its ruleset generation, which fails clearly when
// the subsystem is missing.
func checkNFTables(c *conn) error {
	_, err := c.request(unix.NFT_MSG_GETGEN, unix.AF_UNSPEC, nil)
	if err == nil {
		return nil
	}
	if hostnet.IsNotSupported(err) || errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("the kernel has no nf_tables (load the nf_tables module, or use mode iptables): %w", err)
	}
	return fmt.Errorf("talk to nf_tables: %w", err)
}
