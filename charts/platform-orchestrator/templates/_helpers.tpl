{{/* Chart name. */}}
{{- define "po.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "po.fullname" -}}
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

{{- define "po.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "po.selectorLabels" -}}
app.kubernetes.io/name: {{ include "po.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "po.labels" -}}
helm.sh/chart: {{ include "po.chart" . }}
{{ include "po.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The server's ServiceAccount. */}}
{{- define "po.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "po.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The managed runners' StatefulSet, headless Service and ServiceAccount (52 characters at most: the
StatefulSet's pods carry a controller-revision-hash label of <name>-<10 characters>). */}}
{{- define "po.managedRunnerName" -}}
{{- printf "%s-managed-runner" (include "po.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* Secrets generated on first install and kept across upgrades: named after the release (seed 004's
`<release>-managed-runner`), so that a rename of the chart's objects never loses them. */}}
{{- define "po.managedRunnerSecretName" -}}
{{- printf "%s-managed-runner" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "po.encryptionKeySecretName" -}}
{{- if .Values.encryptionKey.existingSecret }}
{{- .Values.encryptionKey.existingSecret }}
{{- else }}
{{- printf "%s-encryption-key" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "po.bootstrapTokenSecretName" -}}
{{- if .Values.bootstrapToken.existingSecret }}
{{- .Values.bootstrapToken.existingSecret }}
{{- else }}
{{- printf "%s-bootstrap-token" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The value (base64, as Secret data holds it) of `key` in the Secret `name` of this namespace when it
exists (an upgrade, or a reinstall after a kept Secret), else "". `lookup` answers nothing offline
(`helm template`, `--dry-run=client`): a new value is generated there. */}}
{{- define "po.existingSecretData" -}}
{{- $secret := lookup "v1" "Secret" .ctx.Release.Namespace .name }}
{{- dig "data" .key "" $secret }}
{{- end }}

{{/* The orchestrator's URL inside the cluster: its Service. */}}
{{- define "po.serviceUrl" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" (not (empty .Values.tls.secretName))) (include "po.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}

{{/* PO_PUBLIC_URL: publicUrl, or the Service's URL. */}}
{{- define "po.publicUrl" -}}
{{- default (include "po.serviceUrl" .) .Values.publicUrl }}
{{- end }}

{{/* True when the data directory is a volume claim only one pod can mount (ReadWriteOnce, ...): the
Deployment is then replaced (Recreate) rather than rolled. */}}
{{- define "po.exclusiveDataVolume" -}}
{{- if and .Values.persistence.enabled (not (has "ReadWriteMany" .Values.persistence.accessModes)) }}true{{ end }}
{{- end }}

{{/* The checksum of an explicit managedRunners.secret (empty without one: a generated secret never
changes), in the pod templates of the server and of the runners, so that changing it restarts both. */}}
{{- define "po.managedRunnerSecretChecksum" -}}
{{- with .Values.managedRunners.secret }}{{ toString . | sha256sum }}{{ end }}
{{- end }}

{{/* PO_LOG_FORMAT of the server and the managed runners: json or console, anything else refused. */}}
{{- define "po.logFormat" -}}
{{- $format := .Values.logFormat | toString }}
{{- if not (has $format (list "json" "console")) }}
{{- fail (printf "logFormat must be json or console, not %q" $format) }}
{{- end }}
{{- $format }}
{{- end }}
