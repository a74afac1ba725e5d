# syntax=docker/dockerfile:1.7
FROM voipmonitor/vllm:glm51-kimi-20260510

SHELL ["/bin/bash", "-euxo", "pipefail", "-c"]

ARG B12X_REPO=https://github.com/local-inference-lab/b12x.git
ARG B12X_COMMIT=c929144c7689668b07ca65af10ceadf1c745165d
ARG FLASHINFER_REPO=https://github.com/flashinfer-ai/flashinfer.git
ARG FLASHINFER_COMMIT=6885e76a5e12a59220b9dc199d86a64fbe5f6d78
ARG VLLM_BUILD_VERSION=0.11.2.dev278+glm51kimi20260511

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    FLASHINFER_DISABLE_VERSION_CHECK=1 \
    FLASHINFER_CUDA_ARCH_LIST=12.0f \
    FLASHINFER_LOCAL_VERSION=cu130 \
    FLASHINFER_NVCC_THREADS=1 \
    AOT_MAX_JOBS_CAP=8 \
    TORCH_CUDA_ARCH_LIST=12.0a

RUN /opt/venv/bin/python -m pip install --no-cache-dir --upgrade --pre \
      cuda-tile==1.3.0 \
      "nvidia-cutlass-dsl[cu13]==4.5.0"

RUN git clone --recursive --filter=blob:none "${FLASHINFER_REPO}" /tmp/flashinfer-src \
  && cd /tmp/flashinfer-src \
  && git checkout "${FLASHINFER_COMMIT}" \
  && git submodule update --init --recursive \
  && /opt/venv/bin/python -m pip uninstall -y \
      flashinfer-python flashinfer-cubin flashinfer-jit-cache || true \
  && /opt/venv/bin/python -m pip install --no-cache-dir \
      --no-build-isolation --no-deps -v . \
  && /opt/venv/bin/python -m pip wheel --no-cache-dir \
      --no-build-isolation --no-deps -w /tmp/flashinfer-wheels ./flashinfer-cubin \
  && /opt/venv/bin/python -m pip install --no-cache-dir --no-deps --force-reinstall \
      /tmp/flashinfer-wheels/flashinfer_cubin-*.whl \
  && /opt/venv/bin/python -m pip wheel --no-cache-dir \
      --no-build-isolation --no-deps -w /tmp/flashinfer-wheels ./flashinfer-jit-cache \
  && /opt/venv/bin/python -m pip install --no-cache-dir --no-deps --force-reinstall \
      /tmp/flashinfer-wheels/flashinfer_jit_cache-*.whl \
  && /opt/venv/bin/python -c 'import flashinfer, flashinfer_cubin, flashinfer_jit_cache; print("flashinfer", getattr(flashinfer, "__version__", "unknown")); print("flashinfer_cubin", getattr(flashinfer_cubin, "__version__", "unknown")); print("flashinfer_jit_cache", getattr(flashinfer_jit_cache, "__version__", "unknown"))' \
  && rm -rf /tmp/flashinfer-src /tmp/flashinfer-wheels

RUN git clone --filter=blob:none "${B12X_REPO}" /tmp/b12x-src \
  && cd /tmp/b12x-src \
  && git checkout "${B12X_COMMIT}" \
  && /opt/venv/bin/python -m pip install --no-cache-dir --no-deps --force-reinstall . \
  && rm -rf /tmp/b12x-src

RUN /opt/venv/bin/python -m pip uninstall -y vllm || true \
  && rm -rf /opt/vllm \
      /opt/venv/lib/python3.12/site-packages/vllm \
      /opt/venv/lib/python3.12/site-packages/vllm-*.dist-info \
      /opt/venv/lib/python3.12/site-packages/__editable__*vllm* \
      /opt/venv/lib/python3.12/site-packages/__pycache__/vllm*

RUN apt-get update \
  && apt-get install -y --no-install-recommends patchelf \
  && rm -rf /var/lib/apt/lists/*

COPY . /opt/vllm

ARG VLLM_MAX_JOBS=128
ARG VLLM_NVCC_THREADS=1

RUN cd /opt/vllm \
  && VLLM_VERSION_OVERRIDE="${VLLM_BUILD_VERSION}" \
     VLLM_USE_PRECOMPILED=0 \
     MAX_JOBS="${VLLM_MAX_JOBS}" \
     CMAKE_BUILD_PARALLEL_LEVEL="${VLLM_MAX_JOBS}" \
     NVCC_THREADS="${VLLM_NVCC_THREADS}" \
     /opt/venv/bin/python -m pip install --no-cache-dir \
       --no-build-isolation --no-deps --force-reinstall . \
  && install -m 0755 scripts/run-glm51-vllm /usr/local/bin/run-glm51-vllm \
  && install -m 0755 scripts/run-kimi26-vllm /usr/local/bin/run-kimi26-vllm \
  && install -m 0755 scripts/verify-glm-kimi-canonical.sh /usr/local/bin/verify-glm-kimi-canonical \
  && /usr/local/bin/verify-glm-kimi-canonical /opt/vllm \
  && for so in \
       /opt/venv/lib/python3.12/site-packages/vllm/_C.abi3.so \
       /opt/venv/lib/python3.12/site-packages/vllm/_C_stable_libtorch.abi3.so \
       /opt/venv/lib/python3.12/site-packages/vllm/cumem_allocator.abi3.so; do \
       if ! readelf -d "${so}" | grep -Fq 'libcuda.so.1'; then \
         patchelf --add-needed libcuda.so.1 "${so}"; \
       fi; \
       readelf -d "${so}" | grep -F 'libcuda.so.1'; \
     done \
  && /opt/venv/bin/python -c 'import flashinfer, torch, vllm; print("torch", torch.__version__); print("flashinfer", getattr(flashinfer, "__version__", "unknown")); print("vllm", getattr(vllm, "__version__", "unknown"))'

WORKDIR /

ENV HF_OVERRIDES="" \
    MODEL="" \
    SERVED_MODEL_NAME="" \
    PORT="" \
    DCP_SIZE="" \
    TP_SIZE="" \
    GPU_MEMORY_UTILIZATION="" \
    MAX_MODEL_LEN="" \
    MAX_NUM_BATCHED_TOKENS="" \
    MAX_NUM_SEQS="" \
    MAX_CUDAGRAPH_CAPTURE_SIZE="" \
    MOE_BACKEND="" \
    ATTENTION_BACKEND="" \
    KV_CACHE_DTYPE="" \
    GLM51_DISABLE_MTP="" \
    KIMI_DISABLE_MTP="" \
    NCCL_GRAPH_FILE="" \
    NCCL_P2P_LEVEL=SYS \
    NCCL_PROTO=LL,LL128,Simple \
    VLLM_ENABLE_PCIE_ALLREDUCE=1 \
    VLLM_PCIE_ALLREDUCE_BACKEND=cpp \
    VLLM_CPP_AR_1STAGE_NCCL_CUTOFF=56KB \
    VLLM_CPP_AR_IGNORE_CUTOFF_MAX_ROWS=0 \
    VLLM_RTX6K_FUSED_ALLREDUCE_ADD=0 \
    VLLM_RTX6K_FUSED_ALLREDUCE_ADD_END_BARRIER=0 \
    VLLM_DISABLE_SHARED_EXPERTS_STREAM=0 \
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 \
    VLLM_DISABLED_KERNELS=MarlinFP8ScaledMMLinearKernel

LABEL org.opencontainers.image.description="vLLM GLM/Kimi canonical full-install image with b12x 0.13 update, FlashInfer git build, CUTE DSL 4.5.0, DCP/LSE and CPU-sync fixes" \
      voipmonitor.base_image="voipmonitor/vllm:glm51-kimi-20260510" \
      voipmonitor.vllm.canonical_branch="codex/glm51-kimi-canonical-a16-upstream-20260511" \
      voipmonitor.b12x.repo="local-inference-lab/b12x" \
      voipmonitor.b12x.branch="codex/glm51-kimi-b12x-a16-cpuhangfix-cutedsl45-20260512" \
      voipmonitor.b12x.commit="c929144c7689668b07ca65af10ceadf1c745165d" \
      voipmonitor.flashinfer.upstream_repo="flashinfer-ai/flashinfer" \
      voipmonitor.flashinfer.upstream_commit="6885e76a5e12a59220b9dc199d86a64fbe5f6d78" \
      voipmonitor.cutedsl.version="4.5.0"
