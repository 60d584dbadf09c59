{{/* Labels and the image of the operator chart. Resource names are fixed (gshare-operator): one operator per cluster. */}}

{{- define "gshare-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gshare-operator.selectorLabels" -}}
app.kubernetes.io/name: gshare-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gshare-operator.labels" -}}
helm.sh/chart: {{ include "gshare-operator.chart" . }}
{{ include "gshare-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gshare
{{- end -}}

{{- define "gshare-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gshare-operator.tokenSecretName" -}}
{{- required "tokenSecretName is required: the Secret (key internal-jwt) holding the operator token, default gshare-operator-internal-jwt." .Values.tokenSecretName -}}
{{- end -}}
