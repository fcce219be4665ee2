package deploy

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluiceproxy/sluice/test/require"
)

// No container engine runs where the tests run, so the image itself is not built. What can
// be checked without one is checked here: the build command (run for real by the e2e test
// TestImageBuildIsStaticAndStampsTheVersion), the runtime packages against the programs
// sluice executes, and the labels.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
	line int
}

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		trimmed := strings.TrimSpace(l)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		cur.WriteString(l)
		cmd, args, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// baseImage is the image reference of one FROM instruction.
type baseImage struct {
	repo, tag, digest string
	line              int
}

// imageRef is a pinned reference: repository, tag and the sha256 digest of what the tag
// named when it was pinned.
var imageRef = regexp.MustCompile(`^([a-z0-9]+(?:[._/-][a-z0-9]+)*):([A-Za-z0-9_][A-Za-z0-9._-]*)@(sha256:[0-9a-f]{64})$`)

// baseImages returns the Dockerfile's base images (FROM lines naming an earlier stage are
// not images), failing the test for one that is not pinned by digest.
func baseImages(t *testing.T, ins []instruction) []baseImage {
	t.Helper()
	stages := map[string]bool{}
	var out []baseImage
	for _, in := range ins {
		if in.cmd != "FROM" {
			continue
		}
		words := strings.Fields(in.args)
		for len(words) > 0 && strings.HasPrefix(words[0], "--") {
			words = words[1:] // --platform=...
		}
		if len(words) == 0 {
			t.Fatalf("Dockerfile line %d: FROM without an image", in.line)
		}
		from := words[0]
		fromStage := stages[from]
		if len(words) == 3 && strings.EqualFold(words[1], "AS") {
			stages[words[2]] = true
		}
		if fromStage {
			continue
		}
		m := imageRef.FindStringSubmatch(from)
		if m == nil {
			t.Errorf("Dockerfile line %d: FROM %s is not pinned as IMAGE:TAG@sha256:DIGEST (a tag alone changes under every rebuild; see the Dockerfile's header for how to read the digest)", in.line, from)
			continue
		}
		out = append(out, baseImage{repo: m[1], tag: m[2], digest: m[3], line: in.line})
	}
	return out
}

// goImageAndRelease returns the Go version and the Debian release of the build stage's
// golang:VERSION-RELEASE image, and the release of the runtime's debian:RELEASE-slim.
func goImageAndRelease(t *testing.T) (goVersion, buildRelease, runtimeRelease string) {
	t.Helper()
	for _, img := range baseImages(t, readDockerfile(t)) {
		switch img.repo {
		case "golang":
			v, rel, ok := strings.Cut(img.tag, "-")
			if !ok {
				t.Fatalf("Dockerfile line %d: golang:%s does not name a Debian release (want golang:VERSION-RELEASE)", img.line, img.tag)
			}
			goVersion, buildRelease = v, rel
		case "debian":
			rel, ok := strings.CutSuffix(img.tag, "-slim")
			if !ok {
				t.Fatalf("Dockerfile line %d: debian:%s is not a -slim tag", img.line, img.tag)
			}
			runtimeRelease = rel
		default:
			t.Errorf("Dockerfile line %d: unexpected base image %s", img.line, img.repo)
		}
	}
	if goVersion == "" || runtimeRelease == "" {
		t.Fatalf("want a golang build stage and a debian runtime stage; got Go %q, Debian %q", goVersion, runtimeRelease)
	}
	return goVersion, buildRelease, runtimeRelease
}

// shellWords splits a simple shell command line: words separated by blanks, with single
// and double quotes (no escapes, no expansions other than ${NAME} from vars).
func shellWords(line string, vars map[string]string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch c {
		case ' ', '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case '\'', '"':
			end := strings.IndexByte(line[i+1:], c)
			if end < 0 {
				return nil, fmt.Errorf("unclosed %c", c)
			}
			part := line[i+1 : i+1+end]
			if c == '"' {
				part = expand(part, vars)
			}
			w.WriteString(part)
			inWord = true
			i += end + 1
		case '\\', '`', ';', '|', '&':
			return nil, fmt.Errorf("shell syntax %q is beyond this parser; keep the build command simple", c)
		default:
			j := i
			for j < len(line) && !strings.ContainsRune(" \t'\"", rune(line[j])) {
				j++
			}
			w.WriteString(expand(line[i:j], vars))
			inWord = true
			i = j - 1
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

func expand(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := strings.Trim(ref, "${}")
		return vars[name]
	})
}

// goBuild is the Dockerfile's go build, split into environment and arguments.
type goBuild struct {
	env    []string // NAME=value before the command
	args   []string // after "go"
	output string   // the -o value
}

// dockerGoBuild returns the Dockerfile's go build command with VERSION set to version.
func dockerGoBuild(t *testing.T, version string) goBuild {
	t.Helper()
	var runs []instruction
	for _, in := range readDockerfile(t) {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			runs = append(runs, in)
		}
	}
	if len(runs) != 1 {
		t.Fatalf("want one RUN with go build in the Dockerfile, got %d", len(runs))
	}
	words, err := shellWords(runs[0].args, map[string]string{"VERSION": version})
	if err != nil {
		t.Fatalf("Dockerfile line %d: %v", runs[0].line, err)
	}
	var b goBuild
	for len(words) > 0 && strings.Contains(words[0], "=") {
		b.env = append(b.env, words[0])
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("Dockerfile line %d: not a go build: %q", runs[0].line, runs[0].args)
	}
	b.args = words[1:]
	for i, a := range b.args {
		if a == "-o" && i+1 < len(b.args) {
			b.output = b.args[i+1]
		}
	}
	return b
}

func TestDockerfileBuildsStaticTrimmedAndVersioned(t *testing.T) {
	b := dockerGoBuild(t, "v1.2.3-test")
	if !slices.Contains(b.env, "CGO_ENABLED=0") {
		t.Errorf("environment %v: want CGO_ENABLED=0 for a static binary", b.env)
	}
	if !slices.Contains(b.args, "-trimpath") {
		t.Errorf("go build %v: want -trimpath", b.args)
	}
	if !slices.ContainsFunc(b.args, func(a string) bool {
		return strings.HasPrefix(a, "-ldflags=") && strings.Contains(a, "-X github.com/sluiceproxy/sluice/pkg/version.Version=v1.2.3-test")
	}) {
		t.Errorf("go build %v: want -ldflags=... -X github.com/sluiceproxy/sluice/pkg/version.Version=${VERSION}", b.args)
	}
	if b.args[len(b.args)-1] != "./cmd/sluice" {
		t.Errorf("go build %v: want ./cmd/sluice", b.args)
	}
	// The binary lands where the DaemonSets run it.
	ins := readDockerfile(t)
	if !slices.ContainsFunc(ins, func(in instruction) bool {
		return in.cmd == "COPY" && in.args == "--from=build "+b.output+" "+sluiceBinary
	}) {
		t.Errorf("no COPY --from=build %s %s", b.output, sluiceBinary)
	}
	if !slices.ContainsFunc(ins, func(in instruction) bool {
		return in.cmd == "ENTRYPOINT" && in.args == `["`+sluiceBinary+`"]`
	}) {
		t.Errorf("want ENTRYPOINT [%q]", sluiceBinary)
	}
}

func TestDockerfileGoVersionSatisfiesGoMod(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	image, _, _ := goImageAndRelease(t)
	if compareVersions(image, string(m[1])) < 0 {
		t.Errorf("the Dockerfile builds with Go %s; go.mod needs %s", image, m[1])
	}
}

// TestDockerfilePinsBaseImagesByDigest: every base image is IMAGE:TAG@sha256:DIGEST, the
// build and runtime stages share a Debian release (the binary is static, but the two
// should move together), and the file says how to read a new digest.
func TestDockerfilePinsBaseImagesByDigest(t *testing.T) {
	ins := readDockerfile(t)
	if got := len(baseImages(t, ins)); got != 2 {
		t.Errorf("want 2 pinned base images (build and runtime), got %d", got)
	}
	_, build, runtime := goImageAndRelease(t)
	if build != runtime {
		t.Errorf("the build stage is Debian %s, the runtime %s: keep them on one release", build, runtime)
	}
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "imagetools inspect") {
		t.Error("the Dockerfile does not say how to read a new digest (docker buildx imagetools inspect IMAGE:TAG)")
	}
}

func TestImageRefParsing(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0a", 32)
	for ref, ok := range map[string]bool{
		"golang:1.26.8-bookworm@" + digest:        true,
		"debian:bookworm-slim@" + digest:          true,
		"registry.k8s.io/pause:3.10@" + digest:    true,
		"golang:1.26.8-bookworm":                  false, // tag only
		"golang@" + digest:                        false, // digest only: no tag for readers
		"golang:1.26.8-bookworm@sha256:abc":       false, // short digest
		"golang:${GO_VERSION}-bookworm@" + digest: false, // ARG: the tag would not match the digest
	} {
		if got := imageRef.MatchString(ref); got != ok {
			t.Errorf("imageRef.MatchString(%q) = %v, want %v", ref, got, ok)
		}
	}
}

// compareVersions compares dotted numeric versions.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

func TestDockerfileLabelsTheVersion(t *testing.T) {
	for _, in := range readDockerfile(t) {
		if in.cmd == "LABEL" && strings.Contains(in.args, `org.opencontainers.image.version="${VERSION}"`) {
			return
		}
	}
	t.Error(`no LABEL org.opencontainers.image.version="${VERSION}"`)
}

// programsSluiceRuns are the programs sluice executes. No package exports such a list: the
// iptables backend builds names from family and flavour (pkg/dataplane/iptables toolNames:
// iptables or ip6tables, "-nft" or "-legacy" unless it is the flavour installed as plain
// iptables, then "-save" or "-restore"), and the nftables backend runs the explicit-flavour
// save and restore programs to remove iptables leftovers. Everything else (nftables,
// conntrack, IPVS, ipsets, sysctls) is netlink or /proc. Keep this list in step with those
// packages; TestSourceExecsOnlyListedPrograms catches literal program names added anywhere.
var programsSluiceRuns = func() []string {
	var out []string
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, flavour := range []string{"", "-nft", "-legacy"} {
			for _, tool := range []string{"", "-save", "-restore"} {
				out = append(out, base+flavour+tool)
			}
		}
	}
	return out
}()

// programsNotNeeded are programs kube-proxy images ship that sluice must not need: it
// does their work over netlink.
var programsNotNeeded = []string{"nft", "conntrack", "ipset", "ipvsadm", "modprobe", "sysctl", "ip"}

func TestSourceExecsOnlyListedPrograms(t *testing.T) {
	root := repoRoot(t)
	var found []string
	for _, dir := range []string{"pkg", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok || pkg.Name != "exec" {
					return true
				}
				arg := -1
				switch sel.Sel.Name {
				case "Command", "LookPath":
					arg = 0
				case "CommandContext":
					arg = 1
				}
				if arg < 0 || arg >= len(call.Args) {
					return true
				}
				if lit, ok := call.Args[arg].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					name, _ := strconv.Unquote(lit.Value)
					rel, _ := filepath.Rel(root, path)
					found = append(found, name)
					if !slices.Contains(programsSluiceRuns, name) {
						t.Errorf("%s runs %q, which the image may not have: add it to programsSluiceRuns and to the Dockerfile", rel, name)
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range found {
		if slices.Contains(programsNotNeeded, name) {
			t.Errorf("sluice runs %s; the image does not install it", name)
		}
	}
}

// aptInstalled returns the packages the Dockerfile's runtime stage installs.
func aptInstalled(t *testing.T, ins []instruction) []string {
	t.Helper()
	var pkgs []string
	for _, in := range ins {
		if in.cmd != "RUN" {
			continue
		}
		for _, part := range strings.Split(in.args, "&&") {
			words := strings.Fields(part)
			if len(words) < 2 || words[0] != "apt-get" || words[1] != "install" {
				continue
			}
			for _, w := range words[2:] {
				if !strings.HasPrefix(w, "-") {
					pkgs = append(pkgs, w)
				}
			}
		}
	}
	return pkgs
}

func TestImageInstallsEveryProgramSluiceRuns(t *testing.T) {
	ins := readDockerfile(t)
	pkgs := aptInstalled(t, ins)
	if !slices.Equal(pkgs, []string{"iptables"}) {
		t.Errorf("the image installs %v; want exactly iptables (see the Dockerfile for why nothing else)", pkgs)
	}
	for _, p := range programsNotNeeded {
		if slices.Contains(pkgs, p) {
			t.Errorf("the image installs %s, which sluice does not use", p)
		}
	}

	// Does Debian's iptables package provide every program? Only answerable on the same
	// Debian release as the image's.
	_, _, release := goImageAndRelease(t)
	osRelease, err := os.ReadFile("/etc/os-release")
	require.Feature(t, require.ImageRelease, err == nil && strings.Contains(string(osRelease), "VERSION_CODENAME="+release+"\n"),
		fmt.Sprintf("this machine is not Debian %s; cannot list the image's package contents", release))
	out, err := exec.Command("dpkg", "-L", "iptables").Output()
	require.Feature(t, require.ImageRelease, err == nil, fmt.Sprintf("dpkg -L iptables: %v (is iptables installed?)", err))
	provided := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "/usr/sbin/") {
			provided[filepath.Base(l)] = true
		}
	}
	// The unsuffixed names are update-alternatives links the package's postinst registers
	// (iptables, with its -save and -restore followers; ip6tables likewise), which the
	// Dockerfile then points at the nft flavour.
	for _, group := range []string{"iptables", "ip6tables"} {
		q, err := exec.Command("update-alternatives", "--query", group).Output()
		if err != nil {
			t.Errorf("update-alternatives --query %s: %v", group, err)
			continue
		}
		for _, l := range strings.Split(string(q), "\n") {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "Link: ") {
				provided[filepath.Base(strings.TrimPrefix(l, "Link: "))] = true
			}
			if strings.HasPrefix(l, group+"-") && strings.Contains(l, " /usr/sbin/") {
				provided[strings.Fields(l)[0]] = true
			}
		}
		if !slices.ContainsFunc(ins, func(in instruction) bool {
			return in.cmd == "RUN" && strings.Contains(in.args, "update-alternatives --set "+group+" /usr/sbin/"+group+"-nft")
		}) {
			t.Errorf("the Dockerfile does not pin the %s alternative to the nft flavour", group)
		}
	}
	for _, p := range programsSluiceRuns {
		if !provided[p] {
			t.Errorf("Debian %s's iptables package does not provide %s", release, p)
		}
	}
}

func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	// Every COPY source of the build stage must survive .dockerignore.
	lines := strings.Split(string(data), "\n")
	for _, in := range readDockerfile(t) {
		if in.cmd != "COPY" || strings.HasPrefix(in.args, "--from") {
			continue
		}
		srcs := strings.Fields(in.args)
		for _, src := range srcs[:len(srcs)-1] {
			if !slices.Contains(lines, "!"+src) {
				t.Errorf(".dockerignore does not re-include %s, which the Dockerfile copies", src)
			}
		}
	}
}
