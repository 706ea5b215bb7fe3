{{/* Name of the chart, truncated for use in names and labels. */}}
{{- define "prefixserving.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "prefixserving.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the operator pods. */}}
{{- define "prefixserving.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixserving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels on every object of the chart. */}}
{{- define "prefixserving.labels" -}}
{{ include "prefixserving.selectorLabels" . }}
app.kubernetes.io/part-of: prefixserving
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* ServiceAccount name. */}}
{{- define "prefixserving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "prefixserving.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether kopf peering (active-passive HA) is on. */}}
{{- define "prefixserving.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicas) 1) -}}true{{- end -}}
{{- end -}}
