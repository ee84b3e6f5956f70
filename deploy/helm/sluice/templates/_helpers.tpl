{{/* The chart name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource names: fullnameOverride, else the release name (when it contains the chart
name) or <release>-<chart>. */}}
{{- define "sluice.fullname" -}}
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

{{/* Labels that select the pods. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: rate-limit-service
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The ConfigMap holding the rules files. */}}
{{- define "sluice.rulesConfigMap" -}}
{{- if .Values.rules.existingConfigMap }}
{{- .Values.rules.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{/* The Secret and key holding the Redis URL. */}}
{{- define "sluice.redisSecret" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{- define "sluice.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecretKey }}
{{- else }}
{{- "url" }}
{{- end }}
{{- end }}

{{/* The key of the home Redis's URL (global limits) in the Secret of sluice.redisSecret. */}}
{{- define "sluice.redisGlobalSecretKey" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.global.existingSecretKey }}
{{- else }}
{{- "global_url" }}
{{- end }}
{{- end }}

{{/* Checks the values that would make a broken release. */}}
{{- define "sluice.validate" -}}
{{- if not (has .Values.backend (list "memory" "redis")) }}
{{- fail (printf "backend must be memory or redis, not %q" .Values.backend) }}
{{- end }}
{{- if and (eq .Values.backend "redis") (not .Values.redis.url) (not .Values.redis.existingSecret) }}
{{- fail "backend redis needs redis.url or redis.existingSecret" }}
{{- end }}
{{- if not (has .Values.redis.onError (list "error" "allow" "deny" "local")) }}
{{- fail (printf "redis.onError must be error, allow, deny or local, not %q" .Values.redis.onError) }}
{{- end }}
{{- if or (lt (int .Values.redis.connections) 1) (ne (toString .Values.redis.connections) (toString (int .Values.redis.connections))) }}
{{- fail (printf "redis.connections must be a whole number of at least 1, not %v" .Values.redis.connections) }}
{{- end }}
{{- with .Values.redis.global }}
{{- if .region }}
{{- if ne $.Values.backend "redis" }}
{{- fail "redis.global.region needs backend redis: global limits are lent by a home Redis to this region's Redis" }}
{{- end }}
{{- if and (not .url) (not $.Values.redis.existingSecret) }}
{{- fail "redis.global.region needs redis.global.url (or redis.existingSecret with the key redis.global.existingSecretKey)" }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9._-]{1,64}$" (toString .region)) }}
{{- fail (printf "redis.global.region must be 1 to 64 letters, digits, '-', '_' or '.', not %q" (toString .region)) }}
{{- end }}
{{- if and .url (eq .url $.Values.redis.url) }}
{{- fail "redis.global.url must be another Redis than redis.url: the home Redis lends shares to this region's own" }}
{{- end }}
{{- else if .url }}
{{- fail "redis.global.url needs redis.global.region: this region's name" }}
{{- end }}
{{- if not (has .onError (list "deny" "share")) }}
{{- fail (printf "redis.global.onError must be deny or share, not %q" .onError) }}
{{- end }}
{{- if or (lt (int .sharePercent) 1) (gt (int .sharePercent) 100) (ne (toString .sharePercent) (toString (int .sharePercent))) }}
{{- fail (printf "redis.global.sharePercent must be a whole number from 1 to 100, not %v" .sharePercent) }}
{{- end }}
{{- range $key := list "shareMs" "leaseMs" }}
{{- $v := get $.Values.redis.global $key }}
{{- if and $v (or (lt (int $v) 1) (ne (toString $v) (toString (int $v)))) }}
{{- fail (printf "redis.global.%s must be a whole number of milliseconds, not %v" $key $v) }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.redis.tls }}
{{- if .secretName }}
{{- if and $.Values.redis.url (not $.Values.redis.existingSecret) (not (hasPrefix "rediss" $.Values.redis.url)) }}
{{- fail "redis.tls.secretName needs a TLS Redis URL: redis.url must start with rediss (rediss://, rediss+sentinel:// or rediss+cluster://)" }}
{{- end }}
{{- if ne (empty .certKey) (empty .keyKey) }}
{{- fail "redis.tls.certKey and redis.tls.keyKey go together: set both (mTLS) or neither" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (not .Values.rules.existingConfigMap) (not .Values.rules.content) (not .Values.rules.files) }}
{{- fail "rules.content and rules.files are empty and rules.existingConfigMap is not set: sluice needs rules" }}
{{- end }}
{{- if and .Values.admin.tokenMetrics (not (include "sluice.adminSecret" .)) }}
{{- fail "admin.tokenMetrics needs a token: admin.createToken or admin.existingSecret" }}
{{- end }}
{{- if hasKey .Values.rules.files "rules.yaml" }}
{{- if .Values.rules.content }}
{{- fail "rules.files has a rules.yaml: that name is rules.content's" }}
{{- end }}
{{- end }}
{{- if .Values.terminationGracePeriodSeconds }}
{{- $drain := add .Values.shutdown.drainDelaySecs .Values.shutdown.graceSecs }}
{{- if le (int .Values.terminationGracePeriodSeconds) (int $drain) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be longer than shutdown.drainDelaySecs + shutdown.graceSecs (%v), or the kubelet kills sluice before it has drained" .Values.terminationGracePeriodSeconds $drain) }}
{{- end }}
{{- end }}
{{- end }}

{{/* terminationGracePeriodSeconds: longer than the whole drain. */}}
{{- define "sluice.terminationGrace" -}}
{{- if .Values.terminationGracePeriodSeconds }}
{{- .Values.terminationGracePeriodSeconds }}
{{- else }}
{{- add .Values.shutdown.drainDelaySecs .Values.shutdown.graceSecs 5 }}
{{- end }}
{{- end }}

{{/* The Secret and key holding the admin token; empty: no token. */}}
{{- define "sluice.adminSecret" -}}
{{- if .Values.admin.existingSecret }}
{{- .Values.admin.existingSecret }}
{{- else if .Values.admin.createToken }}
{{- printf "%s-admin" (include "sluice.fullname" .) }}
{{- end }}
{{- end }}

{{- define "sluice.adminSecretKey" -}}
{{- if .Values.admin.existingSecret }}
{{- .Values.admin.existingSecretKey }}
{{- else }}
{{- "token" }}
{{- end }}
{{- end }}
