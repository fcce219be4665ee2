package nftables

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// skipKernelCheckEnv is upstream's switch for running on kernels older than 5.13 at the
// operator's own risk; honouring the same name keeps existing deployments working.
const skipKernelCheckEnv = "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK"

// kernelVersion is a Linux release's major and minor numbers.
type kernelVersion struct{ major, minor int }

func (v kernelVersion) atLeast(major, minor int) bool {
	return v.major > major || (v.major == major && v.minor >= minor)
}

func (v kernelVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }

// parseKernelRelease reads "6.18.44-fc-v657" and the like.
func parseKernelRelease(release string) (kernelVersion, error) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return kernelVersion{}, fmt.Errorf("unrecognised kernel release %q", release)
	}
	major, err := strconv.Atoi(parts[0])
	if err != nil {
		return kernelVersion{}, fmt.Errorf("unrecognised kernel release %q", release)
	}
	minorStr := parts[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err := strconv.Atoi(minorStr)
	if err != nil {
		return kernelVersion{}, fmt.Errorf("unrecognised kernel release %q", release)
	}
	return kernelVersion{major, minor}, nil
}

func runningKernel() (kernelVersion, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return kernelVersion{}, fmt.Errorf("uname: %w", err)
	}
	return parseKernelRelease(unix.ByteSliceToString(u.Release[:]))
}

// checkKernel enforces upstream's minimum: kernel 5.13, whose nf_tables has everything
// this table uses and whose distributions ship an nft(8) that can read it
// (https://issues.k8s.io/122743).
func checkKernel(v kernelVersion) error {
	if v.atLeast(5, 13) || os.Getenv(skipKernelCheckEnv) != "" {
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
	if isNotSupported(err) || errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("the kernel has no nf_tables (load the nf_tables module, or use mode iptables): %w", err)
	}
	return fmt.Errorf("talk to nf_tables: %w", err)
}
