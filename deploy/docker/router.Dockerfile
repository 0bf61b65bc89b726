# kvfleet-router image. Build from the repository root:
#   docker build -f deploy/docker/router.Dockerfile -t kvfleet-router .
# Linted by hand (hadolint is not packaged by Debian): see deploy/docker/README.md.

# --- build: Debian 12, the packages of deploy/install-deps.sh ---
FROM debian:12.8 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
# Node.js/npm are test-only dependencies of install-deps.sh; the image build skips them.
# hadolint ignore=DL3008
RUN sed -i '/command -v node\|command -v npm/d' deploy/install-deps.sh \
    && deploy/install-deps.sh \
    && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -G Ninja -DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
    && cmake --build build --target kvfleet-router kvfleet \
    && mkdir -p /out/bin /out/lib \
    && cp build/router/kvfleet-router build/cli/kvfleet /out/bin/ \
    # The shared libraries the binaries need beyond glibc and libstdc++ travel with them.
    && ldd /out/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u \
       | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' \
       | xargs -r cp -L -t /out/lib/

# --- runtime: a slim Debian with the binaries and their libraries ---
FROM debian:12.8-slim
# Versions come with the pinned base image (DL3008 would pin each package too).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kvfleet
COPY --from=build /out/bin/ /opt/kvfleet/bin/
COPY --from=build /out/lib/ /opt/kvfleet/lib/
ENV LD_LIBRARY_PATH=/opt/kvfleet/lib \
    PATH=/opt/kvfleet/bin:$PATH \
    KVFLEET_ROUTER_HTTP_PORT=8000 \
    KVFLEET_ROUTER_LOG_FORMAT=json
USER 10001
# 8000: OpenAI API, /health, /ready, /metrics, /fleet. 5555: worker registration.
EXPOSE 8000 5555
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["/opt/kvfleet/bin/kvfleet-router"]
