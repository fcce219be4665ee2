package topology

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// Names encode the owning test process, so leftovers can be told from a run in progress:
// namespaces are slct-<pid>-<seq>-<host>, links in the test's namespace slct<pid hex><seq hex><suffix>.
var (
	netnsName = regexp.MustCompile(`^` + namePrefix + `-(\d+)-\d+-`)
	linkName  = regexp.MustCompile(`^` + namePrefix + `([0-9a-f]{6})[0-9a-f]`)
)

// Teardown removes the namespaces and links (in the caller's namespace) of topology runs
// whose test process no longer exists, killing any process left inside those namespaces.
// Runs in progress are left alone. New calls it; hack scripts may too (via a test binary).
func Teardown() error {
	var errs []error
	for _, ns := range listNetns() {
		m := netnsName.FindStringSubmatch(ns)
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); processAlive(pid) {
			continue
		}
		killNetnsPids(ns)
		if err := ip("netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, link := range listLinks() {
		m := linkName.FindStringSubmatch(link)
		if m == nil {
			continue
		}
		if pid, _ := strconv.ParseInt(m[1], 16, 64); processAlive(int(pid)) {
			continue
		}
		if err := ip("link", "del", link); err != nil && linkExists(link) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteRun removes everything of one run: its processes must already be stopped.
func deleteRun(id, linkTag string) error {
	var errs []error
	for _, ns := range listNetns() {
		if strings.HasPrefix(ns, id+"-") {
			killNetnsPids(ns) // only if a Stop failed
			if err := ip("netns", "del", ns); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, link := range listLinks() {
		// Deleting a veth also deletes its peer, so later names may already be gone.
		if strings.HasPrefix(link, linkTag) {
			if err := ip("link", "del", link); err != nil && linkExists(link) {
				errs = append(errs, err)
			}
		}
	}
	if left := Leftovers(id, linkTag); len(left) > 0 {
		errs = append(errs, fmt.Errorf("still present after teardown: %v", left))
	}
	return errors.Join(errs...)
}

// Leftovers lists the namespaces and links (in the caller's namespace) whose names start with
// the run's id or link tag.
func Leftovers(id, linkTag string) []string {
	var out []string
	for _, ns := range listNetns() {
		if strings.HasPrefix(ns, id+"-") {
			out = append(out, "netns "+ns)
		}
	}
	for _, link := range listLinks() {
		if strings.HasPrefix(link, linkTag) {
			out = append(out, "link "+link)
		}
	}
	return out
}

// LinkTag is the prefix of the links this run created in the test's namespace.
func (c *Cluster) LinkTag() string { return c.linkTag }

func listNetns() []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0]) // "name (id: 3)"
		}
	}
	return names
}

func listLinks() []string {
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		// "12: slct001234a1br: <BROADCAST,...>" or "13: slct001234a1a@if2: ..."
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		names = append(names, name)
	}
	return names
}

func linkExists(name string) bool {
	return exec.Command("ip", "link", "show", "dev", name).Run() == nil
}

func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
