#!/usr/bin/env python3
"""Re-address the iptables and ipvs tests onto the shared fixture's address plan, and prove
that the regenerated golden files are the old ones with only the addresses substituted.

  hack/readdress-goldens.py rewrite iptables|ipvs FILE...   rewrite test sources in place
  hack/readdress-goldens.py prove   iptables|ipvs           old golden (git show main:) -> map -> diff new

For iptables the map also renames KUBE-SEP-<hash> chains: upstream's endpoint chain name is
base32(sha256(portName + protocol + endpoint))[:16], so it changes with the endpoint address.
The old name is recomputed from the rule that jumps to it (the check fails if it does not
reproduce), the new one from the re-addressed endpoint; the renderer declares chains sorted
by name (descending), so the declaration lines are re-sorted after renaming.

The proof of commit ba3c4ae (issue 12 item 4): from the repository root,
  BASE=4c1bb08 hack/readdress-goldens.py prove iptables
  BASE=4c1bb08 hack/readdress-goldens.py prove ipvs
Each golden must print "identical after the address map".
"""
import base64, hashlib, os, re, subprocess, sys

V4 = re.compile(r'(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(/\d{1,3})?(?![\d])')
V6 = re.compile(r'(?<![0-9a-fA-F:])([0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{0,4}){2,7})(/\d{1,3})?(?![0-9a-fA-F:])')

def v4_iptables(a, plen):
    exact = {'192.168.100.1': '192.168.0.2', '192.168.100.2': '192.168.0.10', '192.168.100.0/24': '192.168.0.0/24'}
    k = a + (plen or '')
    if k in exact: return exact[k]
    for old, new in (('10.0.1.', '10.180.1.'), ('10.0.2.', '10.180.2.')):
        if a.startswith(old): return new + a[len(old):] + (plen or '')
    return None

def v4_ipvs(a, plen):
    exact = {'192.168.0.10': '192.168.0.2', '203.0.113.1': '192.168.0.2', '203.0.113.2': '192.168.0.10',
             '203.0.113.3': '192.168.0.11', '203.0.113.1/24': '192.168.0.2/24', '203.0.113.2/24': '192.168.0.10/24',
             '10.244.0.0/16': '10.0.0.0/8'}
    k = a + (plen or '')
    if k in exact: return exact[k]
    for old, new in (('10.244.', '10.180.'), ('10.96.', '172.30.'), ('192.0.2.', '192.168.99.'), ('203.0.113.', '5.6.7.')):
        if a.startswith(old): return new + a[len(old):] + (plen or '')
    return None

V6MAP = {
    'iptables': {'fd00:192:168::2': '2001:db8::1', 'fd00:100::1': '2001:db8::1', 'fd00:100::2': '2001:db8::10',
                 '2001:db8::5': '2001:db8:77::7', 'fd00:172:30::/64': 'fd00:172:30::/112'},
    'ipvs': {'2001:db8:0:1::10': '2001:db8::1', 'fd00:c::1': '2001:db8::1', 'fd00:c::1/64': '2001:db8::1/64',
             'fd00:c::2/64': '2001:db8::10/64', 'fd00:96::10': 'fd00:172:30::10', 'fd00:96::11': 'fd00:172:30::11',
             'fd00:96::12': 'fd00:172:30::12', 'fd00::10': 'fd00:172:30::10', 'fd00:244::/48': 'fd00:10::/64',
             'fd00:244:1::1/64': 'fd00:10::1/64', 'fd00:244:1::2/64': 'fd00:10::2/64', 'fd00:244:1::1': 'fd00:10::1',
             'fd00:244:1::2': 'fd00:10::2', 'fd00:244:2::3': 'fd00:10::3', 'fd00:244:2::4': 'fd00:10::4',
             'fd00:244:2::5': 'fd00:10::5', 'fd00:244::2': 'fd00:10::2', 'fd00:244::3': 'fd00:10::3',
             '2001:db8:7::7': '2001:db8:1::7',
             '2001:db8:1::/48': '2001:db8:77::/64'},
}
FMT = {'iptables': {}, 'ipvs': {'"10.244.%d.': '"10.180.%d.', '"192.0.2.%d"': '"192.168.99.%d"', '"203.0.113.%d"': '"5.6.7.%d"',
                                '"10.96.1.%d"': '"172.30.1.%d"', '"10.96.0.%d"': '"172.30.0.%d"', '"10.96.%d.%d"': '"172.30.%d.%d"',
                                '"10.244.2.%d:': '"10.180.2.%d:', '"10.244.1.%d:': '"10.180.1.%d:', '10.244.N.': '10.180.N.'}}

def readdress(pkg, text):
    v4 = v4_iptables if pkg == 'iptables' else v4_ipvs
    def sub4(m):
        r = v4(m.group(1), m.group(2))
        return r if r is not None else m.group(0)
    def sub6(m):
        k = m.group(1) + (m.group(2) or '')
        if k in V6MAP[pkg]: return V6MAP[pkg][k]
        if m.group(1) in V6MAP[pkg]: return V6MAP[pkg][m.group(1)] + (m.group(2) or '')
        return m.group(0)
    for old, new in FMT[pkg].items():
        text = text.replace(old, new)
    return V6.sub(sub6, V4.sub(sub4, text))

def sep(port, proto, endpoint):
    return 'KUBE-SEP-' + base64.b32encode(hashlib.sha256((port + proto + endpoint).encode()).digest()).decode()[:16]

JUMP = re.compile(r'--comment "(\S+) -> (\S+)".* -p (\w+) .*-j (KUBE-SEP-\w+)|--comment "(\S+) -> (\S+)".*-j (KUBE-SEP-\w+)')

def rename_seps(pkg, old):
    """Old SEP name -> new SEP name, from the rules that jump to each (ip:port endpoint)."""
    ren = {}
    for line in old.splitlines():
        m = re.search(r'--comment "(\S+) -> (\S+)".*-j (KUBE-SEP-\w+)', line)
        if not m: continue
        port, ep, name = m.groups()
        for proto in ('tcp', 'udp', 'sctp'):
            if sep(port, proto, ep) == name: break
        else:
            sys.exit(f'cannot reproduce {name} from {port} {ep}')
        ren[name] = sep(port, proto, readdress(pkg, ep))
    return ren

def sort_decls(text):
    out, run = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith(':KUBE-SEP-'):
            run.append(line); continue
        out += sorted(run, reverse=True); run = []
        out.append(line)
    return ''.join(out + sorted(run, reverse=True))

def prove(pkg):
    import glob, difflib
    files = sorted(glob.glob(f'pkg/dataplane/{pkg}/testdata/*.golden'))
    ok = True
    for f in files:
        old = subprocess.run(['git', 'show', os.environ.get('BASE', 'main') + ':' + f], capture_output=True, text=True, check=True).stdout
        new = open(f).read()
        want = readdress(pkg, old)
        if pkg == 'iptables':
            ren = rename_seps(pkg, old)
            want = re.sub(r'KUBE-SEP-\w+', lambda m: ren.get(m.group(0), m.group(0)), want)
            want = sort_decls(want)
        same = want == new
        ok &= same
        print(f'{f}: {"identical" if same else "DIFFERS"} after the address map'
              + (f' ({len(ren)} KUBE-SEP chains renamed)' if pkg == 'iptables' else '')
              + f'; {sum(a != b for a, b in zip(old.splitlines(), new.splitlines()))} lines changed')
        if not same:
            sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), new.splitlines(True), 'mapped-old', 'new'))
    sys.exit(0 if ok else 1)

if __name__ == '__main__':
    mode, pkg = sys.argv[1], sys.argv[2]
    if mode == 'prove':
        prove(pkg)
    else:
        for f in sys.argv[3:]:
            t = open(f).read()
            n = readdress(pkg, t)
            if n != t:
                open(f, 'w').write(n)
