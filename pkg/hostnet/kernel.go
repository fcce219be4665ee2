package hostnet

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// KernelVersion is the major.minor.patch of a Linux release.
type KernelVersion struct{ Major, Minor, Patch int }

func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or later.
func (v KernelVersion) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// ParseKernelRelease reads a release as uname -r prints it: "6.1.0-56-amd64", "5.10.0",
// "4.19.112+", "6.9", "5.14.0-427.el9.x86_64". Major and minor must be there; the patch
// level is 0 when it is missing or does not start with a digit.
func ParseKernelRelease(release string) (KernelVersion, error) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return KernelVersion{}, fmt.Errorf("unparsable kernel release %q", release)
	}
	var nums [3]int
	for i, p := range parts {
		end := 0
		for end < len(p) && p[end] >= '0' && p[end] <= '9' {
			end++
		}
		if end == 0 {
			if i < 2 {
				return KernelVersion{}, fmt.Errorf("unparsable kernel release %q", release)
			}
			break
		}
		nums[i], _ = strconv.Atoi(p[:end])
		if end < len(p) {
			// "1-rc2", "112+": what follows the number is not a version.
			break
		}
	}
	return KernelVersion{nums[0], nums[1], nums[2]}, nil
}

// RunningKernel returns the version of the kernel this process runs on.
func RunningKernel() (KernelVersion, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return KernelVersion{}, fmt.Errorf("uname: %w", err)
	}
	return ParseKernelRelease(unix.ByteSliceToString(u.Release[:]))
}

// IsNotSupported reports whether err says the kernel lacks a subsystem (nf_tables, ipset,
// a netlink family): EPROTONOSUPPORT, EAFNOSUPPORT or EOPNOTSUPP, or, from libraries that
// lose the errno, the words "not supported".
func IsNotSupported(err error) bool {
	var errno syscall.Errno
	if errors.As(err, &errno) && (errno == unix.EPROTONOSUPPORT || errno == unix.EAFNOSUPPORT || errno == unix.EOPNOTSUPP) {
		return true
	}
	return err != nil && strings.Contains(err.Error(), "not supported")
}
