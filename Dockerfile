# sluice's image: a static sluice binary on Debian with iptables (both flavours).
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t sluice:dev .
#
# test/deploy checks this file: the go build below is run with exactly these flags and the
# result must be static and report VERSION; the packages installed must provide every
# program sluice executes.

ARG GO_VERSION=1.26.8
# The runtime's Debian release, also used for the build stage so that both agree.
ARG DEBIAN_RELEASE=bookworm

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# Modules first: this layer is reused while go.mod and go.sum do not change.
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
ARG VERSION=dev
# Static (no cgo: sluice talks to the kernel over netlink and runs iptables as programs),
# reproducible paths, the version stamped in. Keep in one line: test/deploy runs it.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X github.com/sluiceproxy/sluice/pkg/version.Version=${VERSION}" -o /out/sluice ./cmd/sluice

FROM debian:${DEBIAN_RELEASE}-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="A drop-in replacement for kube-proxy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/sluiceproxy/sluice"

# iptables: the iptables and ip6tables programs of both flavours, iptables-nft-* and
# iptables-legacy-* (with -save and -restore), for the iptables mode and for removing
# kube-proxy's iptables leftovers in the other modes. Nothing else is needed: nftables,
# conntrack, IPVS and ipsets are programmed over netlink (no nft, conntrack, ipvsadm or
# ipset binaries), and the kernel loads modules itself (no kmod).
#
# No iptables-wrapper either. A node must use one iptables flavour, the one its kubelet
# uses; upstream's image finds it with a wrapper script that re-points `iptables` on first
# use. sluice does the same detection itself at start (kubelet's KUBE-IPTABLES-HINT chain,
# then whichever flavour holds more chains) and then runs iptables-nft-* or
# iptables-legacy-* by name, so the `iptables` alternative only decides the fallback on a
# node that has no rules at all yet: nf_tables, pinned here rather than left to Debian's
# priorities.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables \
 && update-alternatives --set iptables /usr/sbin/iptables-nft \
 && update-alternatives --set ip6tables /usr/sbin/ip6tables-nft \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/*

COPY --from=build /out/sluice /usr/local/bin/sluice
# kube-proxy's path too, so that a kube-proxy DaemonSet whose command is
# /usr/local/bin/kube-proxy runs sluice after changing only the image.
RUN ln -s sluice /usr/local/bin/kube-proxy

ENTRYPOINT ["/usr/local/bin/sluice"]
