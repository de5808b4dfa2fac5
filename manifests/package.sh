#!/usr/bin/env bash
# package.sh packages the Helm chart for release (`make chart`): appVersion is the image version,
# so the chart's default image tags are the images `make images` builds with the same VERSION.
# Pin the images by digest with the values file `make images` writes
# (_output/images/values-digests.yaml) or --set agent.image.digest=sha256:...
#
# Usage: manifests/package.sh APP_VERSION [CHART_VERSION] [output dir]
#   APP_VERSION    image version, e.g. v0.1.0 (git describe)
#   CHART_VERSION  SemVer chart version; default: version in Chart.yaml
#   output dir     default _output/chart
# Push the package to an OCI registry with: helm push _output/chart/nodevigil-X.tgz oci://REGISTRY/charts
set -euo pipefail

HELM_VERSION=v3.19.0
dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
chart="$dir/charts/nodevigil"
app_version=${1:?usage: package.sh APP_VERSION [CHART_VERSION] [output dir]}
chart_version=${2:-$(awk '$1 == "version:" {print $2; exit}' "$chart/Chart.yaml")}
out=${3:-"$dir/../_output/chart"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if ! [[ "$chart_version" =~ ^v?[0-9]+\.[0-9]+\.[0-9]+([-+].*)?$ ]]; then
	echo "package.sh: chart version $chart_version is not SemVer (e.g. 0.1.0); set CHART_VERSION" >&2
	exit 2
fi

if [[ -n "${HELM:-}" ]]; then
	"$HELM" package "$chart" --version "$chart_version" --app-version "$app_version" --destination "$out"
else
	(cd "${TMPDIR:-/tmp}" && go run "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" package "$chart" \
		--version "$chart_version" --app-version "$app_version" --destination "$out")
fi
