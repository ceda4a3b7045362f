# vial: one image with the `vial` binary; `vial serve` by default.
#   docker build -t vial .
#   docker run -p 5000:5000 -v vial-data:/var/lib/vial vial
# Production (PostgreSQL for metadata, S3 for blobs): pass secrets in the environment, not argv:
#   docker run -p 5000:5000 -e VIAL_METADATA_URL=postgres://vial:…@db:5432/vial \
#     -e VIAL_BLOB_URL=s3://models/vial -e AWS_ENDPOINT_URL=http://minio:9000 \
#     -e AWS_ACCESS_KEY_ID=… -e AWS_SECRET_ACCESS_KEY=… \
#     -v /etc/vial:/etc/vial:ro -e VIAL_CONFIG=/etc/vial/vial.toml vial
# (authentication and TLS: see docs/vial.example.toml)
# It was not built in CI: no container engine or base image is reachable there.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# protoc compiles containerd's API (vial snapshotter).
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cargo build --release --locked -p vial-cli && strip target/release/vial

FROM debian:bookworm-slim
# fuse3 for `vial mount` inside the container (needs --device /dev/fuse --cap-add SYS_ADMIN).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates fuse3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/vial vial \
 && mkdir -p /var/lib/vial && chown vial /var/lib/vial
COPY --from=build /src/target/release/vial /usr/local/bin/vial
USER vial
VOLUME /var/lib/vial
ENV VIAL_ADDR=0.0.0.0:5000 VIAL_DATA=/var/lib/vial
EXPOSE 5000
HEALTHCHECK CMD ["vial", "--version"]
ENTRYPOINT ["vial"]
CMD ["serve"]
