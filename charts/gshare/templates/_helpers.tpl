{{/*
Names, labels and the pieces every workload of the chart shares (image, environment, security).
*/}}

{{- define "gshare.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release prefix of every resource name: <release>-gshare, or the release name when it contains "gshare". */}}
{{- define "gshare.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gshare.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component. Call with (dict "ctx" $ "component" "api"). */}}
{{- define "gshare.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gshare.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Standard labels of one component. Call with (dict "ctx" $ "component" "api"). */}}
{{- define "gshare.labels" -}}
helm.sh/chart: {{ include "gshare.chart" .ctx }}
{{ include "gshare.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: gshare
{{- end -}}

{{- define "gshare.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "gshare.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gshare.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Name of the api Service (both Ingresses route to it). */}}
{{- define "gshare.apiServiceName" -}}
{{- printf "%s-api" (include "gshare.fullname" .) -}}
{{- end -}}

{{/* Host of the internal-plane Ingress: its own host, else the public one. */}}
{{- define "gshare.internalHost" -}}
{{- .Values.ingress.internalPlane.host | default .Values.ingress.host -}}
{{- end -}}

{{/*
The upstream-vhost annotation of an Ingress of host .host, as YAML: ingress-nginx then sends the api `Host: <.host>`
on every location of that Ingress instead of the client's Host header (or, with use-forwarded-headers, its
X-Forwarded-Host), so the api judges the host nginx routed the request by (GSHARE_INTERNAL_HOSTS) and never a
name the client chose. On a host two Ingresses share, each location keeps its own Ingress's annotations. Fails
when .annotations (the values at .value) set another upstream-vhost.
*/}}
{{- define "gshare.vhostAnnotations" -}}
{{- $key := "nginx.ingress.kubernetes.io/upstream-vhost" -}}
{{- with (get .annotations $key) -}}
{{- if ne (toString .) $.host -}}
{{- fail (printf "%s sets %s to %q: the chart sets it to the Ingress's own host %s, so that the api judges the host ingress-nginx routed the request by, never a Host header the client chose. Remove it (docs/install.md, \"The internal plane\")." $.value $key (toString .) $.host) -}}
{{- end -}}
{{- end -}}
{{- dict $key .host | toYaml -}}
{{- end -}}

{{/* The api Service's in-cluster DNS names: <svc>, <svc>.<namespace>, <svc>.<namespace>.svc, <svc>.<namespace>.svc.<clusterDomain>. */}}
{{- define "gshare.serviceHosts" -}}
{{- $svc := include "gshare.apiServiceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns (.Values.clusterDomain | trimSuffix ".")) | join "," -}}
{{- end -}}

{{/* The host of controlPlaneUrl, lowercase, without its port. */}}
{{- define "gshare.controlPlaneHost" -}}
{{- regexReplaceAll ":[0-9]+$" ((urlParse .Values.controlPlaneUrl).host | lower) "" -}}
{{- end -}}

{{/*
GSHARE_INTERNAL_HOSTS, comma-separated, the pod's IP appended in the environment itself: the hosts on which
the api answers /internal and /.well-known (every other host, the public one above all, gets 404 there).
They are the api Service's in-cluster names, ingress.internalPlane.host when the internal plane is enabled,
and the host of controlPlaneUrl: the host the clusters use. ingress.host is one only when the internal plane's
Ingress shares it; ingress-nginx then merges that Ingress's /internal and /.well-known locations, with their
source range, into the public host's server, so the restriction still holds there.
Fails when controlPlaneUrl is on the public host without the internal plane on it (the clusters would get 404),
and when the internal plane shares the public host through another IngressClass (the public controller would
then serve /internal there without the source range).
*/}}
{{- define "gshare.internalHosts" -}}
{{- $public := "" -}}
{{- if .Values.ingress.enabled -}}{{- $public = .Values.ingress.host | lower -}}{{- end -}}
{{- $plane := .Values.ingress.internalPlane -}}
{{- $planeHost := "" -}}
{{- if $plane.enabled -}}{{- $planeHost = include "gshare.internalHost" . | lower -}}{{- end -}}
{{- if and $public (eq $planeHost $public) (ne ($plane.className | default .Values.ingress.className) .Values.ingress.className) -}}
{{- fail (printf "ingress.internalPlane.className %q differs from ingress.className %q while both Ingresses use host %s: the public controller would serve /internal and /.well-known of that host without the source range. Give the internal plane a host of its own (ingress.internalPlane.host), or the same className." $plane.className .Values.ingress.className $public) -}}
{{- end -}}
{{- $cpHost := include "gshare.controlPlaneHost" . -}}
{{- if and $public (eq $cpHost $public) (ne $planeHost $public) -}}
{{- fail (printf "controlPlaneUrl %s is on the public host ingress.host (%s), where /internal and /.well-known answer 404: the data-plane clusters could not report. Enable ingress.internalPlane with the clusters' sourceRange (its host may be ingress.host), or set controlPlaneUrl to the host the clusters reach the api Service at (docs/install.md, \"The internal plane\")." .Values.controlPlaneUrl $public) -}}
{{- end -}}
{{- $hosts := splitList "," (include "gshare.serviceHosts" .) -}}
{{- with $planeHost -}}{{- $hosts = append $hosts . -}}{{- end -}}
{{- with $cpHost -}}{{- $hosts = append $hosts . -}}{{- end -}}
{{- $hosts | uniq | join "," -}}
{{- end -}}

{{/*
DJANGO_ALLOWED_HOSTS, comma-separated: django.allowedHosts, the public Ingress host and the internal hosts
(gshare.internalHosts). The pod's IP is appended in the environment itself (the kubelet's probes use it as Host).
*/}}
{{- define "gshare.allowedHosts" -}}
{{- $hosts := list -}}
{{- range .Values.django.allowedHosts -}}{{- $hosts = append $hosts . -}}{{- end -}}
{{- if and .Values.ingress.enabled .Values.ingress.host -}}{{- $hosts = append $hosts .Values.ingress.host -}}{{- end -}}
{{- $hosts = concat $hosts (splitList "," (include "gshare.internalHosts" .)) -}}
{{- $hosts | uniq | join "," -}}
{{- end -}}

{{/* DJANGO_CSRF_TRUSTED_ORIGINS: django.csrfTrustedOrigins, else https://<ingress.host>. */}}
{{- define "gshare.csrfTrustedOrigins" -}}
{{- if .Values.django.csrfTrustedOrigins -}}
{{- .Values.django.csrfTrustedOrigins | join "," -}}
{{- else if and .Values.ingress.enabled .Values.ingress.host -}}
{{- printf "https://%s" .Values.ingress.host -}}
{{- end -}}
{{- end -}}

{{/*
One environment entry read from a Secret. Call with ("prefix" is the values key, for messages)
(dict "env" "DATABASE_URL" "ref" .Values.database "prefix" "database" "what" "the PostgreSQL URL").
*/}}
{{- define "gshare.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s.existingSecret is required: the name of a Secret in the release namespace whose key %s.secretKey (%q) holds %s (%s). Create it first: see docs/install.md." .prefix .prefix .ref.secretKey .env .what) .ref.existingSecret | quote }}
      key: {{ required (printf "%s.secretKey is required: the key of Secret %q that holds %s." .prefix .ref.existingSecret .env) .ref.secretKey | quote }}
{{- end -}}

{{/* The secret settings: never accepted as plain values. */}}
{{- define "gshare.secretSettingNames" -}}
DATABASE_URL REDIS_URL DJANGO_SECRET_KEY GSHARE_ENCRYPTION_KEYS GSHARE_METRICS_TOKEN
{{- end -}}

{{/* The environment the chart itself sets: production mode, the Secrets, and the settings that have values of their own. */}}
{{- define "gshare.chartEnv" -}}
{{- if not .Values.controlPlaneUrl -}}
{{- fail "controlPlaneUrl is required: the control plane's URL as the data-plane clusters reach it, e.g. https://gshare.example.com (GSHARE_CONTROL_PLANE_URL)." -}}
{{- end -}}
{{- if not (regexMatch "^https?://[^/]+" .Values.controlPlaneUrl) -}}
{{- fail (printf "controlPlaneUrl must be an http(s) URL such as https://gshare.example.com, got %q." .Values.controlPlaneUrl) -}}
{{- end -}}
- name: GSHARE_PRODUCTION
  value: "true"
- name: DJANGO_SETTINGS_MODULE
  value: gshare.settings
{{ include "gshare.secretEnv" (dict "env" "DATABASE_URL" "ref" .Values.database "prefix" "database" "what" "the PostgreSQL URL") }}
{{ include "gshare.secretEnv" (dict "env" "REDIS_URL" "ref" .Values.redis "prefix" "redis" "what" "the Redis URL") }}
{{ include "gshare.secretEnv" (dict "env" "DJANGO_SECRET_KEY" "ref" .Values.django "prefix" "django" "what" "Django's secret key") }}
{{ include "gshare.secretEnv" (dict "env" "GSHARE_ENCRYPTION_KEYS" "ref" .Values.encryption "prefix" "encryption" "what" "comma-separated Fernet keys") }}
{{- with .Values.metrics.token }}{{ if .existingSecret }}
{{ include "gshare.secretEnv" (dict "env" "GSHARE_METRICS_TOKEN" "ref" . "prefix" "metrics.token" "what" "the bearer token GET /metrics requires") }}
{{- end }}{{ end }}
- name: DATABASE_CONN_MAX_AGE
  value: {{ .Values.database.connMaxAge | quote }}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: DJANGO_ALLOWED_HOSTS
  value: {{ printf "%s,$(POD_IP)" (include "gshare.allowedHosts" .) | trimPrefix "," | quote }}
- name: GSHARE_INTERNAL_HOSTS
  value: {{ printf "%s,$(POD_IP)" (include "gshare.internalHosts" .) | quote }}
- name: DJANGO_CSRF_TRUSTED_ORIGINS
  value: {{ include "gshare.csrfTrustedOrigins" . | quote }}
- name: GSHARE_CONTROL_PLANE_URL
  value: {{ .Values.controlPlaneUrl | trimSuffix "/" | quote }}
- name: GSHARE_SESSION_NAMESPACE
  value: {{ .Values.sessionNamespace | quote }}
- name: GSHARE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: GSHARE_HOME
  value: /tmp/gshare
{{- end -}}

{{/*
The environment of every container of the chart (api, worker, beat, migrations): the chart's own entries,
then `settings` (plain values), then `extraEnv`. A name may appear once only.
*/}}
{{- define "gshare.env" -}}
{{- $chartEnv := include "gshare.chartEnv" . -}}
{{- /* PROMETHEUS_MULTIPROC_DIR: set on the api container itself (templates/deployment-api.yaml). */ -}}
{{- $taken := list "PROMETHEUS_MULTIPROC_DIR" -}}
{{- range fromYamlArray $chartEnv }}{{ $taken = append $taken .name }}{{ end -}}
{{- $secretNames := splitList " " (include "gshare.secretSettingNames" .) -}}
{{ $chartEnv }}
{{- range $name, $value := .Values.settings }}
{{- if has $name $secretNames }}
{{- fail (printf "settings.%s is refused: secrets never go into values. Put it in a Secret and name that Secret in the matching existingSecret value (docs/install.md)." $name) }}
{{- else if has $name $taken }}
{{- fail (printf "settings.%s is refused: the chart sets %s itself from its own values (see charts/gshare/values.yaml)." $name $name) }}
{{- end }}
{{- $taken = append $taken $name }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name $taken }}
{{- fail (printf "extraEnv entry %s is refused: the chart or settings already set it." .name) }}
{{- end }}
{{- $taken = append $taken .name }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod-level security: a fixed non-root user, the runtime's default seccomp profile. */}}
{{- define "gshare.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security: read-only root, no privilege escalation, no capabilities. */}}
{{- define "gshare.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The one writable place of every container: /tmp (GSHARE_HOME, gunicorn's heartbeat files, kubeconfig temp files). */}}
{{- define "gshare.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "gshare.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Scheduling and pull settings shared by every pod. */}}
{{- define "gshare.podScheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod template metadata of one component. Call with (dict "ctx" $ "component" "api"), plus "annotations" (a dict) for
   pod annotations of its own, merged under podAnnotations. */}}
{{- define "gshare.podMetadata" -}}
labels:
  {{- include "gshare.labels" . | nindent 2 }}
  {{- with .ctx.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (dict) (.annotations | default dict) (.ctx.Values.podAnnotations | default dict) }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
