#!/usr/bin/env bash
# verify.sh fails when manifests/install.yaml is not what manifests/render.sh renders from the
# chart now (someone changed the chart and did not re-render, or edited install.yaml by hand).
# It also lints the chart. CI runs it through `make verify-manifests`.
set -euo pipefail

dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/kustomize"
bash "$dir/render.sh" "$tmp/install.yaml" >/dev/null

for f in kustomize/nodevigil.yaml kustomize/kustomization.yaml; do
	[[ -f "$dir/$f" ]] || { echo "manifests/$f is missing; run \`make manifests\`" >&2; exit 1; }
done
if ! diff -u "$dir/kustomize/nodevigil.yaml" "$tmp/kustomize/nodevigil.yaml" >"$tmp/kdiff"; then
	echo "manifests/kustomize/nodevigil.yaml is stale. Run \`make manifests\` (bash manifests/render.sh) and commit it. Difference:" >&2
	head -n 200 "$tmp/kdiff" >&2
	exit 1
fi

if ! diff -u "$dir/install.yaml" "$tmp/install.yaml" >"$tmp/diff"; then
	echo "manifests/install.yaml is stale: it differs from what manifests/render.sh renders from manifests/charts/nodevigil." >&2
	echo "Run \`make manifests\` (bash manifests/render.sh) and commit manifests/install.yaml. Difference (committed → rendered):" >&2
	head -n 200 "$tmp/diff" >&2
	exit 1
fi

# Lint with the pinned helm (render.sh built it already, so this is quick).
HELM_VERSION=v3.19.0
if [[ -n "${HELM:-}" ]]; then
	"$HELM" lint --strict --kube-version 1.31.0 "$dir/charts/nodevigil" >"$tmp/lint" 2>&1 || { cat "$tmp/lint" >&2; exit 1; }
else
	(cd "${TMPDIR:-/tmp}" && go run "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" lint --strict --kube-version 1.31.0 "$dir/charts/nodevigil") >"$tmp/lint" 2>&1 || {
		echo "helm lint --strict failed for manifests/charts/nodevigil:" >&2
		cat "$tmp/lint" >&2
		exit 1
	}
fi
echo "manifests/install.yaml and manifests/kustomize are up to date; chart lints clean"
