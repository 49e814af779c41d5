{{/* Chart name, truncated to 63 characters (DNS label limit). */}}
{{- define "atlas-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "atlas-operator.fullname" -}}
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

{{/* chart label value: <name>-<version>. */}}
{{- define "atlas-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels (stable across upgrades: never add version labels here). */}}
{{- define "atlas-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "atlas-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Standard labels on every object; callers add app.kubernetes.io/component. */}}
{{- define "atlas-operator.labels" -}}
helm.sh/chart: {{ include "atlas-operator.chart" . }}
{{ include "atlas-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: atlas
{{- end }}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "atlas-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "atlas-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Operator image reference. */}}
{{- define "atlas-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Default trainer image (ATLAS_TRAINER_IMAGE). */}}
{{- define "atlas-operator.trainerImage" -}}
{{- default (printf "ghcr.io/arc-computer/atlas-trainer:%s" .Chart.AppVersion) .Values.operator.trainerImage }}
{{- end }}

{{/* Default rollout/student image (ATLAS_ROLLOUT_IMAGE): the trainer image ships vLLM. */}}
{{- define "atlas-operator.rolloutImage" -}}
{{- default (include "atlas-operator.trainerImage" .) .Values.operator.rolloutImage }}
{{- end }}

{{/*
Watched namespaces, comma-joined (ATLAS_WATCH_NAMESPACES). Empty = cluster-wide, except with
rbac.scope=namespaced, where an empty list means the release namespace (the only one with a Role).
*/}}
{{- define "atlas-operator.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- join "," (uniq .Values.watchNamespaces) }}
{{- else if and .Values.rbac.create (eq .Values.rbac.scope "namespaced") }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* RBAC rules, parsed from files/rbac-rules.yaml (the single place they are defined). */}}
{{- define "atlas-operator.rules" -}}
{{- .Files.Get "files/rbac-rules.yaml" }}
{{- end }}
