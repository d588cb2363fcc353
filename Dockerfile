# tollgate: a static binary on a minimal image, run as a non-root user.
#   docker build -t tollgate --build-arg VERSION=$(git describe --tags --always) .
#   docker run -v $PWD/tollgate.yaml:/etc/tollgate/tollgate.yaml -p 8080:8080 tollgate
# docs/operations.md describes the deployments (one instance on SQLite, several
# on PostgreSQL behind a load balancer: deploy/docker-compose.yml).

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
ARG COMMIT=unknown
# The SQLite driver is pure Go: CGO off gives a static binary.
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/tollgate ./cmd/tollgate \
 && mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tollgate /usr/local/bin/tollgate
# The SQLite database and the charge journal live here (mount a volume).
COPY --from=build --chown=65532:65532 /out/data /var/lib/tollgate
USER 65532:65532
WORKDIR /var/lib/tollgate
ENV TOLLGATE_CONFIG=/etc/tollgate/tollgate.yaml
# api, public (pricing), admin (health, readiness, metrics, admin API)
EXPOSE 8080 8081 9090
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
