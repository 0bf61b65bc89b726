# choose_backend CMAKE_CACHE GPU: which worker backend a build can use on this machine.
# Sourced by deploy/quickstart.sh; tests/deploy/choose_backend_test.sh feeds it fake inputs.
# kvfleet-worker --backend auto (its default) makes the same choice from inside
# (worker/backend/backend.h, ChooseBackend).
#
#   CMAKE_CACHE  the build's CMakeCache.txt
#   GPU          nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader, first line
#                ("NVIDIA H100 80GB HBM3, 9.0"); empty when there is no usable GPU
#
# Prints one line, "<backend> <reason>": "cuda NVIDIA H100 80GB HBM3, compute capability
# 9.0" or "cpu build has no CUDA". cuda only when the build has the CUDA backend
# (KVFLEET_CUDA ON) and its kernels were built for the GPU: the targets come from
# KVFLEET_CUDA_GENCODE (code=sm_90a, code=compute_90) and CMAKE_CUDA_ARCHITECTURES
# (90a, 90, 90-real, 90-virtual, native, all, all-major).
#   sm_XYa, XYa      this capability exactly (arch-specific features such as wgmma)
#   sm_XY, XY-real   the same major version, minor Y or later (binary compatible)
#   compute_XY, XY,  XY or later (PTX, compiled by the driver)
#   XY-virtual
#   native, all      any GPU (native: the build machine's, assumed to be this one)

# _cuda_target_runs TARGET MAJOR MINOR: true when code built for TARGET runs on MAJOR.MINOR.
_cuda_target_runs() {
  local target="$1" major="$2" minor="$3" kind num suffix
  case "$target" in
    native|all|all-major) return 0 ;;
    sm_*) kind=real; target="${target#sm_}" ;;
    compute_*) kind=virtual; target="${target#compute_}" ;;
    *-real) kind=real; target="${target%-real}" ;;
    *-virtual) kind=virtual; target="${target%-virtual}" ;;
    *) kind=virtual ;;  # CMake's bare "90": real and virtual, so PTX for later GPUs too
  esac
  num="${target%%[!0-9]*}"
  suffix="${target#"$num"}"
  [[ "$num" =~ ^[0-9]{2,3}$ ]] || return 1
  local tmajor=$((10#${num:0:-1})) tminor=$((10#${num: -1}))
  if [ -n "$suffix" ]; then  # 90a, 100f: built for this capability only
    [ "$major" -eq "$tmajor" ] && [ "$minor" -eq "$tminor" ]
  elif [ "$kind" = real ]; then
    [ "$major" -eq "$tmajor" ] && [ "$minor" -ge "$tminor" ]
  else
    [ $((major * 10 + minor)) -ge $((tmajor * 10 + tminor)) ]
  fi
}

choose_backend() {
  local cache="$1" gpu="$2" cuda gencode archs targets=() t
  if [ ! -f "$cache" ]; then echo "cpu no build configuration at $cache"; return; fi
  cuda="$(sed -n 's/^KVFLEET_CUDA:[A-Z]*=//p' "$cache" | head -1)"
  case "${cuda^^}" in
    ON|TRUE|YES|1) ;;
    *) echo "cpu build has no CUDA"; return ;;
  esac
  if [ -z "$gpu" ]; then echo "cpu no NVIDIA GPU found"; return; fi
  local name="${gpu%,*}" cap="${gpu##*,}"
  name="$(echo "$name" | xargs)"; cap="$(echo "$cap" | xargs)"
  if ! [[ "$cap" =~ ^[0-9]+\.[0-9]+$ ]]; then
    echo "cpu nvidia-smi reports no compute capability for $name"; return
  fi
  gencode="$(sed -n 's/^KVFLEET_CUDA_GENCODE:[A-Z]*=//p' "$cache" | head -1)"
  for t in $(echo "$gencode" | grep -oE '(^|[ ,])code=(\[[^]]*\]|[a-z_0-9]+)' | sed 's/^.*code=//' | tr -d '[]' | tr ',' ' '); do
    targets+=("$t")
  done
  for t in $(echo "$gencode" | grep -oE '(^| )-arch[= ]sm_[0-9]+[af]?' | grep -oE '[0-9]+[af]?$'); do
    targets+=("$t")  # -arch=sm_90: real and virtual
  done
  archs="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$cache" | head -1)"
  case "${archs^^}" in
    ""|OFF|FALSE|NO|0) ;;
    *) for t in ${archs//;/ }; do targets+=("$t"); done ;;
  esac
  if [ "${#targets[@]}" -eq 0 ]; then
    echo "cpu build names no CUDA architectures"; return
  fi
  local major="${cap%.*}" minor="${cap#*.}"
  for t in "${targets[@]}"; do
    if _cuda_target_runs "$t" "$major" "$minor"; then
      echo "cuda $name, compute capability $cap"; return
    fi
  done
  echo "cpu GPU compute capability $cap, build targets ${targets[*]}"
}
