{{/* Chart name. */}}
{{- define "po-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "po-agent.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "po-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "po-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "po-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "po-agent.labels" -}}
helm.sh/chart: {{ include "po-agent.chart" . }}
{{ include "po-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The agent's ServiceAccount. */}}
{{- define "po-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "po-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the agent's private key: the existing one, or the chart's. */}}
{{- define "po-agent.privateKeySecretName" -}}
{{- if .Values.gateway.privateKeyExistingSecret }}
{{- .Values.gateway.privateKeyExistingSecret }}
{{- else }}
{{- printf "%s-private-key" (include "po-agent.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Namespace of the runner Jobs. */}}
{{- define "po-agent.jobsNamespace" -}}
{{- default .Release.Namespace .Values.jobsRbac.namespace }}
{{- end }}

{{/* PO_LOG_FORMAT of the agent: json or console, anything else refused. */}}
{{- define "po-agent.logFormat" -}}
{{- $format := .Values.platformOrchestrator.logFormat | toString }}
{{- if not (has $format (list "json" "console")) }}
{{- fail (printf "platformOrchestrator.logFormat must be json or console, not %q" $format) }}
{{- end }}
{{- $format }}
{{- end }}
