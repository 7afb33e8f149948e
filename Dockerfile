# syntax=docker/dockerfile:1
#
# clodex: one image holding every binary (clodex-controlplane,
# clodex-dataplane, clodexctl, clodex-sim), static, run as a non-root user,
# with no shell or anything else at run time.
#
#   make image            # docker build with VERSION and SOURCE_DATE_EPOCH from git
#
# The binaries are built by scripts/build.sh, the command `make build` runs,
# so the image and a local build of one commit hold the same bytes.
# Compose, Kubernetes and systemd files under deploy/ choose the binary with
# their command (the binaries are on PATH).

ARG GO_VERSION=1.26.10

FROM docker.io/library/golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN ./scripts/build.sh /out/usr/local/bin "$VERSION" \
 && mkdir -p /out/var/lib/clodex /out/etc/clodex /out/tmp \
 && chmod 1777 /out/tmp

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
COPY --from=build /out/tmp /tmp
COPY --from=build --chown=65532:65532 /out/var/lib/clodex /var/lib/clodex
COPY --from=build /out/etc/clodex /etc/clodex
ENV PATH=/usr/local/bin \
    HOME=/var/lib/clodex \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
WORKDIR /var/lib/clodex
# The control plane's gRPC, the data plane's API, and their admin listeners.
EXPOSE 17700 17701 17645 17646
CMD ["clodex-controlplane", "--help"]
