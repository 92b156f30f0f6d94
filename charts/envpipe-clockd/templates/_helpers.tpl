{{- define "envpipe-clockd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- $ttl := float64 .Values.leaseTTLSeconds -}}
{{- if or (lt $ttl 0.5) (gt $ttl 300.0) -}}
{{- fail (printf "leaseTTLSeconds (%v) must lie in 0.5-300" .Values.leaseTTLSeconds) -}}
{{- end -}}
{{- end -}}

{{- define "envpipe-clockd.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "envpipe-clockd.labels" -}}
{{ include "envpipe-clockd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: clock-daemon
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "envpipe-clockd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "envpipe-clockd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- $ttl := float64 .Values.leaseTTLSeconds -}}
{{- if or (lt $ttl 0.5) (gt $ttl 300.0) -}}
{{- fail (printf "leaseTTLSeconds (%v) must lie in 0.5-300" .Values.leaseTTLSeconds) -}}
{{- end -}}
{{- end -}}

{{- define "envpipe-clockd.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Checks the schema cannot express: min against max, and the TTL range of a --set string. */}}
{{- define "envpipe-clockd.validate" -}}
{{- if gt (int .Values.clocks.minMHz) (int .Values.clocks.maxMHz) -}}
{{- fail (printf "clocks.minMHz (%d) must not exceed clocks.maxMHz (%d)" (int .Values.clocks.minMHz) (int .Values.clocks.maxMHz)) -}}
{{- end -}}
{{- $ttl := float64 .Values.leaseTTLSeconds -}}
{{- if or (lt $ttl 0.5) (gt $ttl 300.0) -}}
{{- fail (printf "leaseTTLSeconds (%v) must lie in 0.5-300" .Values.leaseTTLSeconds) -}}
{{- end -}}
{{- end -}}

{{/* The state file stays out of the socket directory, which training pods mount. */}}
{{- define "envpipe-clockd.validateState" -}}
{{- if eq (clean .Values.state.hostDir) (clean .Values.socket.hostDir) -}}
{{- fail (printf "state.hostDir (%s) must not be socket.hostDir: training pods mount the socket directory" .Values.state.hostDir) -}}
{{- end -}}
{{- end -}}
