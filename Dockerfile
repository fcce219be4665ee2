# sluice's image: a static sluice binary on Debian with iptables (both flavours).
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t sluice:dev .
#
# test/deploy checks this file: the go build below is run with exactly these flags and the
# result must be static and report VERSION; the packages installed must provide every
# program sluice executes.

# Base images are pinned by digest: a tag is moved by every rebuild of the official image, a
# digest names exactly the bytes this file was checked with, so a rebuild of the same commit
# gets the same toolchain and the same runtime packages. The tag stays in front of the digest
# for readers (the registry resolves the digest alone). Both stages use the same Debian
# release. test/deploy checks all of this.
#
# To update one, pick the tag (a Go patch release, or the same tag to take a Debian rebuild),
# read the digest of its multi-platform index, and replace tag and digest together:
#
#   docker buildx imagetools inspect golang:1.26.8-bookworm   # "Digest:" line
#   crane digest debian:bookworm-slim                         # the same, with go-containerregistry
#
# (docker-library/repo-info's repos/<image>/remote/<tag>.md lists the same digests.) The Go
# release must satisfy go.mod's go line.

FROM golang:1.26.8-bookworm@sha256:a688600ca24f8a4d3ca77f95b0dd40704a9fc787c826660eb7ba0b641b8b175d AS build
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

FROM debian:bookworm-slim@sha256:7c7b2c966bc9ee8cedfeef67e0e279108992c77681fa595db4a9d65c06ccc587
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
