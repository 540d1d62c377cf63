#!/usr/bin/env bash
# End-to-end check of draslice on a real cluster: a LoRA fine-tune on a DRA GPU slice,
# submitted through Kubeflow Pipelines, must finish with the verdict line.
#
#   1. skip (exit 77) when the cluster publishes no ResourceSlice for the driver, so the
#      check stays green on device-plugin-only clusters (like the seed's c15_dra_gpu_slice.sh)
#   2. apply the ResourceClaimTemplate, then `draslice preflight` (its exit 77 = skip)
#   3. apply RBAC and, in policy mode, the admission policy; label the namespace opt-in
#   4. `draslice upload`, then `draslice submit --upload --wait` (exit code from the run state)
#   5. read the run's pod logs: "DRA LoRA SFT on GPU slice: OK" and "verdict: PASS"
#
# Exit: 0 passed, 1 failed, 2 bad setup (missing tool or file), 77 skipped.
# Everything is a variable; the defaults fit standalone KFP in namespace kubeflow; the
# manifests are rendered by `draslice manifests` for TEMPLATE and NAMESPACE. KFP credentials: $KFP_TOKEN, or pass the
# `draslice` connection flags in KFP_ARGS (e.g. KFP_ARGS="--token-file /path --ca-bundle ca.pem").
#
#   KFP_HOST=http://127.0.0.1:8080 TEMPLATE=mig-1g-6gb scripts/e2e_dra_gpu_slice.sh

set -euo pipefail

DRIVER="${DRIVER:-gpu.nvidia.com}"
TEMPLATE="${TEMPLATE:-mig-1g-6gb}"
MODE="${MODE:-policy}"                      # policy | native
NAMESPACE="${NAMESPACE:-kubeflow}"          # where the claim template and the run's pods live
KFP_HOST="${KFP_HOST:-${KF_PIPELINES_ENDPOINT:-}}"
KFP_ARGS="${KFP_ARGS:-}"                    # extra draslice connection flags, space separated
# The manifests are rendered with `draslice manifests` for TEMPLATE and NAMESPACE, unless a
# file is given. PROFILE: the MIG profile of a mig-* template (derived: mig-1g-6gb -> 1g.6gb;
# set it for profiles such as 1g.10gb+me).
PROFILE="${PROFILE:-}"
ENGINE="${ENGINE:-map-v1}"                  # map-v1 (1.36+) | map-v1beta1 | kyverno | kyverno-clusterpolicy
SERVICE_ACCOUNT="${SERVICE_ACCOUNT:-pipeline-runner}"   # KFP multi-user: default-editor
CLAIM_TEMPLATE_FILE="${CLAIM_TEMPLATE_FILE:-}"
RBAC_FILE="${RBAC_FILE:-}"
ADMISSION_FILE="${ADMISSION_FILE:-}"
NAMESPACE_LABEL="${NAMESPACE_LABEL:-draslice.dev/claim-injection=enabled}"
VARIANT="${VARIANT:-sft.${MODE}.${TEMPLATE}}"
EXPERIMENT="${EXPERIMENT:-draslice-e2e}"
TIMEOUT="${TIMEOUT:-1800}"                  # seconds to wait for the run
POLL="${POLL:-10}"                          # seconds between run status reads
PREFLIGHT_ARGS="${PREFLIGHT_ARGS:---on-missing-dra skip}"
DRASLICE="${DRASLICE:-draslice}"
KUBECTL="${KUBECTL:-kubectl}"
OK_LINE="DRA LoRA SFT on GPU slice: OK"
VERDICT_LINE="verdict: PASS"

say()  { printf '[e2e] %s\n' "$*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() { say "FAIL: $*"; exit 1; }
bad()  { say "SETUP: $*"; exit 2; }

read -r -a kfp_args <<< "${KFP_ARGS}"
read -r -a preflight_args <<< "${PREFLIGHT_ARGS}"

for tool in "${KUBECTL}" "${DRASLICE}"; do
  command -v "${tool}" >/dev/null 2>&1 || bad "'${tool}' is not on PATH"
done
[[ -n "${KFP_HOST}" ]] || bad "set KFP_HOST (e.g. http://127.0.0.1:8080 after kubectl port-forward)"
[[ "${MODE}" == policy || "${MODE}" == native ]] || bad "MODE must be policy or native"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
render() {  # render <file> <draslice manifests args...>: the YAML for this run's namespace
  local file="$1"; shift
  "${DRASLICE}" manifests "$@" > "${file}" || bad "draslice manifests $* failed"
}
if [[ -z "${CLAIM_TEMPLATE_FILE}" ]]; then
  CLAIM_TEMPLATE_FILE="${work}/claim-template.yaml"
  case "${TEMPLATE}" in
    shared-gpu-timeslice) claim_args=(--shared timeslicing) ;;
    shared-gpu-mps) claim_args=(--shared mps) ;;
    mig-*) p="${TEMPLATE#mig-}"; claim_args=(--profile "${PROFILE:-${p/-/.}}") ;;
    *) bad "template ${TEMPLATE}: set CLAIM_TEMPLATE_FILE (or PROFILE for a MIG profile)" ;;
  esac
  render "${CLAIM_TEMPLATE_FILE}" claim-templates "${claim_args[@]}" --namespace "${NAMESPACE}"
  grep -qx "  name: ${TEMPLATE}" "${CLAIM_TEMPLATE_FILE}" \
    || bad "draslice manifests ${claim_args[*]} does not name its template ${TEMPLATE}: set PROFILE"
fi
if [[ -z "${RBAC_FILE}" ]]; then
  RBAC_FILE="${work}/rbac.yaml"
  render "${RBAC_FILE}" rbac --namespace "${NAMESPACE}" --service-account "${SERVICE_ACCOUNT}"
fi
if [[ "${MODE}" == policy && -z "${ADMISSION_FILE}" ]]; then
  ADMISSION_FILE="${work}/admission-policy.yaml"
  render "${ADMISSION_FILE}" admission-policy --engine "${ENGINE}"
fi
for f in "${CLAIM_TEMPLATE_FILE}" "${RBAC_FILE}" ${ADMISSION_FILE:+"${ADMISSION_FILE}"}; do
  [[ -f "${f}" ]] || bad "no file ${f}"
done

# 1. Does the driver publish anything? No DRA API or no slice for the driver: skip.
if ! drivers="$("${KUBECTL}" get resourceslices \
      -o jsonpath='{range .items[*]}{.spec.driver}{"\n"}{end}' 2>/dev/null)"; then
  skip "this cluster serves no resource.k8s.io ResourceSlice API (no DRA)"
fi
slices="$(grep -cxF -- "${DRIVER}" <<< "${drivers}" || true)"
[[ "${slices}" -gt 0 ]] || skip "no ResourceSlice for driver ${DRIVER} (device-plugin-only cluster?)"
say "driver ${DRIVER} publishes ${slices} ResourceSlice(s)"

# 2. The claim template, then the preflight that reads it against the published devices.
"${KUBECTL}" apply -n "${NAMESPACE}" -f "${CLAIM_TEMPLATE_FILE}"
set +e
"${DRASLICE}" preflight --template "${TEMPLATE}" --namespace "${NAMESPACE}" "${preflight_args[@]}"
rc=$?
set -e
case "${rc}" in
  0) say "preflight: ready" ;;
  77) skip "draslice preflight found no usable DRA device for ${TEMPLATE}" ;;
  *) fail "draslice preflight exited ${rc}" ;;
esac

# 3. RBAC for the pipeline runner; in policy mode the admission policy and the opt-in label.
"${KUBECTL}" apply -f "${RBAC_FILE}"
if [[ "${MODE}" == policy ]]; then
  "${KUBECTL}" apply -f "${ADMISSION_FILE}"
  "${KUBECTL}" label namespace "${NAMESPACE}" "${NAMESPACE_LABEL}" --overwrite
fi

# 4. Upload (idempotent) and run that version; the exit code is the run's final state.
"${DRASLICE}" upload --variant "${VARIANT}" --host "${KFP_HOST}" "${kfp_args[@]}"
out="${work}/submit.out"
set +e
"${DRASLICE}" submit --variant "${VARIANT}" --upload --experiment "${EXPERIMENT}" \
  --param on_missing_dra=fail --wait --timeout "${TIMEOUT}" --poll "${POLL}" \
  --host "${KFP_HOST}" "${kfp_args[@]}" | tee "${out}"
rc=${PIPESTATUS[0]}
set -e
run_id="$(sed -n 's/^run .* id=\([^ ]*\).*/\1/p' "${out}" | head -n 1)"
[[ -n "${run_id}" ]] || fail "draslice submit made no run (exit ${rc})"
[[ "${rc}" -eq 0 ]] || fail "run ${run_id} did not succeed (draslice submit exit ${rc})"

# 5. The verdict lines, from the run's pods (label pipeline/runid, or via its workflow).
logs="$("${KUBECTL}" logs -n "${NAMESPACE}" -l "pipeline/runid=${run_id}" -c main \
          --tail=-1 --max-log-requests 20 2>/dev/null || true)"
if [[ -z "${logs}" ]]; then
  workflow="$("${KUBECTL}" get workflows -n "${NAMESPACE}" -l "pipeline/runid=${run_id}" \
                -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
  if [[ -n "${workflow}" ]]; then
    logs="$("${KUBECTL}" logs -n "${NAMESPACE}" -l "workflows.argoproj.io/workflow=${workflow}" \
              -c main --tail=-1 --max-log-requests 20 2>/dev/null || true)"
  fi
fi
grep -qF -- "${OK_LINE}" <<< "${logs}" || fail "no '${OK_LINE}' in the logs of run ${run_id}"
grep -qF -- "${VERDICT_LINE}" <<< "${logs}" || fail "no '${VERDICT_LINE}' in the logs of run ${run_id}"
say "PASS: run ${run_id} on ${TEMPLATE} (${MODE} mode): ${OK_LINE}; ${VERDICT_LINE}"
