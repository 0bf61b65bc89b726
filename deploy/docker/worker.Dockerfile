# kvfleet-worker image, on NVIDIA's CUDA runtime base. Build from the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t kvfleet-worker .
# Run with the NVIDIA container toolkit: docker run --gpus '"device=0"' ...
# Linted by hand (hadolint is not packaged by Debian): see deploy/docker/README.md.

# The runtime base's CUDA version and the toolkit package that matches it.
ARG CUDA_VERSION=12.6.3
ARG CUDA_TOOLKIT_PACKAGE=cuda-toolkit-12-6

# --- build: Debian 12 (the packages of deploy/install-deps.sh) + NVIDIA's CUDA toolkit ---
FROM debian:12.8 AS build
ARG CUDA_TOOLKIT_PACKAGE
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
# hadolint ignore=DL3008
RUN sed -i '/command -v node\|command -v npm/d' deploy/install-deps.sh \
    && deploy/install-deps.sh \
    && apt-get update \
    && apt-get install -y --no-install-recommends wget ca-certificates \
    && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
    && dpkg -i cuda-keyring_1.1-1_all.deb \
    && rm cuda-keyring_1.1-1_all.deb \
    && apt-get update \
    && apt-get install -y --no-install-recommends "${CUDA_TOOLKIT_PACKAGE}" \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:$PATH
COPY . .
# The GPUs the image serves (cmake/KvfleetOptions.cmake; sm_90a = H100/H200).
ARG KVFLEET_CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
RUN cmake -S . -B build -G Ninja -DKVFLEET_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
          -DKVFLEET_CUDA_GENCODE="${KVFLEET_CUDA_GENCODE}" \
    && cmake --build build --target kvfleet-worker kvfleet \
    && mkdir -p /out/bin /out/lib \
    && cp build/worker/kvfleet-worker build/cli/kvfleet /out/bin/ \
    # Libraries beyond glibc, libstdc++ and CUDA (the runtime base provides those; the
    # driver comes from the host) travel with the binaries.
    && ldd /out/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u \
       | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[A-Za-z]*|libnccl)\.so' \
       | xargs -r cp -L -t /out/lib/

# --- runtime: CUDA runtime libraries (cuBLAS, NCCL) on Ubuntu 24.04 (glibc 2.39 >= Debian 12's 2.36) ---
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin kvfleet
COPY --from=build /out/bin/ /opt/kvfleet/bin/
COPY --from=build /out/lib/ /opt/kvfleet/lib/
ENV LD_LIBRARY_PATH=/opt/kvfleet/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/kvfleet/bin:$PATH \
    KVFLEET_WORKER_BACKEND=cuda \
    KVFLEET_WORKER_MODEL_DIR=/models/model \
    KVFLEET_WORKER_HTTP_PORT=9400 \
    KVFLEET_WORKER_LOG_FORMAT=json \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001
# 5556 requests (Contract 3), 5557 KV events PUB, 5558 replay, 9400 /health /ready /metrics.
EXPOSE 5556 5557 5558 5559 9400
VOLUME ["/models"]
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:9400/health"]
ENTRYPOINT ["/opt/kvfleet/bin/kvfleet-worker"]
