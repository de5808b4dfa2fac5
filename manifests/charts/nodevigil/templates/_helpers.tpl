{{/*
nodevigil.name is the chart name, or nameOverride.
*/}}
{{- define "nodevigil.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
nodevigil.fullname prefixes every object name: the release name when it already contains the
chart name (release "nodevigil" gives nodevigil-agent, nodevigil-remediator), else
<release>-<chart>.
*/}}
{{- define "nodevigil.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "nodevigil.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nodevigil.agent.fullname" -}}
{{- printf "%s-agent" (include "nodevigil.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodevigil.remediator.fullname" -}}
{{- printf "%s-remediator" (include "nodevigil.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nodevigil.agent.serviceAccountName" -}}
{{- default (include "nodevigil.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- end -}}

{{- define "nodevigil.remediator.serviceAccountName" -}}
{{- default (include "nodevigil.remediator.fullname" .) .Values.remediator.serviceAccount.name -}}
{{- end -}}

{{/*
nodevigil.labels are the common labels of every object.
*/}}
{{- define "nodevigil.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "nodevigil.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodevigil
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
nodevigil.selectorLabels select one component's pods; call with (dict "ctx" $ "component" "agent").
They never change across upgrades (a workload's selector is immutable).
*/}}
{{- define "nodevigil.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nodevigil.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "nodevigil.componentLabels" -}}
{{ include "nodevigil.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
nodevigil.image renders repository:tag or repository@digest; call with (dict "ctx" $ "image" .Values.agent.image).
*/}}
{{- define "nodevigil.image" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
nodevigil.agent.username is the agent's ServiceAccount as the API server names it in
request.userInfo.username; the admission policies match on it.
*/}}
{{- define "nodevigil.agent.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "nodevigil.agent.serviceAccountName" .) -}}
{{- end -}}

{{/*
nodevigil.celStrings renders a list of strings as a CEL list literal. The values are validated
(taint keys and condition types are qualified names) so JSON string quoting is also CEL quoting.
*/}}
{{- define "nodevigil.celStrings" -}}
{{- toJson . -}}
{{- end -}}

{{/*
nodevigil.validate fails rendering with a message naming the value and the fix.
*/}}
{{- define "nodevigil.validate" -}}
{{- if not .Values.agent.ownedTaints -}}
{{- fail "agent.ownedTaints is empty: list at least one startup taint key (default readiness.k8s.io/nodevigil-agent-not-ready)" -}}
{{- end -}}
{{- range .Values.agent.ownedTaints -}}
{{- if not (regexMatch "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$" .) -}}
{{- fail (printf "agent.ownedTaints entry %q is not a valid taint key (an optional lower-case DNS prefix and a slash, then a name; no =value or :Effect), e.g. readiness.k8s.io/nodevigil-agent-not-ready" .) -}}
{{- end -}}
{{- end -}}
{{- range .Values.agent.ownedTaints -}}
{{- /* Taints other components own: the agent would remove them, and the admission policy would
let it. The kubernetes.io and k8s.io namespaces are reserved (readiness.k8s.io/, meant for
readiness taints like ours, excepted), and so are the taints of the autoscalers and EKS. */ -}}
{{- if and (regexMatch "^([^/]*\\.)?(kubernetes\\.io|k8s\\.io)/" .) (not (hasPrefix "readiness.k8s.io/" .)) -}}
{{- fail (printf "agent.ownedTaints entry %q is a Kubernetes system taint (node.kubernetes.io/*, node.cloudprovider.kubernetes.io/*, node-role.kubernetes.io/* and every other kubernetes.io or k8s.io key belong to Kubernetes components); use a key of your own domain or readiness.k8s.io/<name>" .) -}}
{{- end -}}
{{- if or (regexMatch "^([^/]*\\.)?(karpenter\\.sh|eks\\.amazonaws\\.com)/" .) (has . (list "ToBeDeletedByClusterAutoscaler" "DeletionCandidateOfClusterAutoscaler" "nodevigil.io/remediating")) -}}
{{- fail (printf "agent.ownedTaints entry %q belongs to another component (Karpenter, EKS, the cluster autoscaler or the nodevigil remediator); the agent may own only its startup taints" .) -}}
{{- end -}}
{{- end -}}
{{- range .Values.agent.conditionTypes -}}
{{- if not (regexMatch "^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$" .) -}}
{{- fail (printf "agent.conditionTypes entry %q is not a condition type" .) -}}
{{- end -}}
{{- if has . (list "Ready" "MemoryPressure" "DiskPressure" "PIDPressure" "NetworkUnavailable") -}}
{{- fail (printf "agent.conditionTypes entry %q is a built-in Node condition the kubelet or the cloud provider owns; the agent may own only its own types (KubeletHealthy, NetworkingReady, MemoryHealthy, KubeletConfigValid and the AWS event conditions NoSpotInterruption, NoRebalanceRecommendation, NoScheduledEvent, NoASGTermination)" .) -}}
{{- end -}}
{{- end -}}
{{- if and (not .Values.remediator.dryRun) (not (include "nodevigil.ownershipTagKey" .)) -}}
{{- fail "remediator.clusterName is empty but remediator.dryRun is false: set remediator.clusterName to the EKS cluster name, so that the remediator terminates only instances tagged kubernetes.io/cluster/<clusterName> (or set remediator.ownershipTag.key to an opt-in tag, or keep remediator.dryRun=true)" -}}
{{- end -}}
{{- if and (hasKey .Values.remediator.podDisruptionBudget "minAvailable") (hasKey .Values.remediator.podDisruptionBudget "maxUnavailable") -}}
{{- fail "remediator.podDisruptionBudget: set maxUnavailable or minAvailable, not both (maxUnavailable: 1 is the default and never blocks a node drain; set maxUnavailable: null to use minAvailable)" -}}
{{- end -}}
{{- range $k := list "apiVersion" "kind" "namespace" "hostRoot" "listenAddress" "ownedTaints" "kubeletRepair" "kubeletUnit" "cniConfDir" "cniBinDir" "cniPreset" "missingOwnedTaintIsUnhealthy" "logLevel" "logFormat" "imds" -}}
{{- if hasKey $.Values.agent.config $k -}}
{{- fail (printf "agent.config.%s is set by the chart; use the agent value of the same meaning (see values.yaml) instead" $k) -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.remediator.config "dryRun" -}}
{{- fail "remediator.config.dryRun is set by the chart; set remediator.dryRun instead" -}}
{{- end -}}
{{- range $k := list "apiVersion" "kind" "agentNamespace" -}}
{{- if hasKey $.Values.remediator.config $k -}}
{{- fail (printf "remediator.config.%s is set by the chart (the agents run in the release namespace); remove it" $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
nodevigil.agent.guaranteed refuses agent resources that would take the agent out of the
Guaranteed QoS class: under node memory pressure the kubelet evicts and the kernel OOM-kills
Burstable pods first, and the agent is the one reporting that pressure.
*/}}
{{- define "nodevigil.agent.guaranteed" -}}
{{- $res := .Values.agent.resources -}}
{{- range $r := list "cpu" "memory" -}}
{{- if ne (toString (dig "requests" $r "" $res)) (toString (dig "limits" $r "" $res)) -}}
{{- fail (printf "agent.resources.requests.%s and limits.%s must be set and equal so the agent pod is Guaranteed QoS and is not evicted or OOM-killed first under node memory pressure" $r $r) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
nodevigil.gomemlimit renders the GOMEMLIMIT env var at percent of the container's memory limit
(in bytes), or nothing without a limit. resourceFieldRef cannot scale a value, so the chart
parses the quantity itself; call with (dict "resources" .Values.x.resources "percent" N "field" "x.resources").
*/}}
{{- define "nodevigil.gomemlimit" -}}
{{- $lim := "" -}}
{{- with .resources -}}{{- with .limits -}}{{- with .memory -}}{{- $lim = toString . -}}{{- end -}}{{- end -}}{{- end -}}
{{- if $lim -}}
{{- $m := regexFindAll "^([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?$" $lim 1 -}}
{{- if not $m -}}
{{- fail (printf "%s.limits.memory %q: use a whole number with an optional Ki, Mi, Gi, Ti, k, M, G or T suffix (e.g. 512Mi) so that GOMEMLIMIT can be derived from it" .field $lim) -}}
{{- end -}}
{{- $num := regexFind "^[0-9]+" $lim | int64 -}}
{{- $suffix := trimPrefix (regexFind "^[0-9]+" $lim) $lim -}}
{{- $mult := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) $suffix | int64 -}}
- name: GOMEMLIMIT
  value: {{ div (mul $num $mult .percent) 100 | toString | quote }}
{{- end -}}
{{- end -}}

{{/*
The EC2 tag key the remediator requires before it terminates an instance (--cluster-tag-key):
remediator.ownershipTag.key, else kubernetes.io/cluster/<remediator.clusterName>, else empty.
*/}}
{{- define "nodevigil.ownershipTagKey" -}}
{{- if .Values.remediator.ownershipTag.key -}}
{{- .Values.remediator.ownershipTag.key -}}
{{- else if .Values.remediator.clusterName -}}
kubernetes.io/cluster/{{ .Values.remediator.clusterName }}
{{- end -}}
{{- end }}
