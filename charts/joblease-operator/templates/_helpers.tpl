{{/* The chart name, overridable with nameOverride. */}}
{{- define "joblease-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: the prefix of every object, overridable with fullnameOverride. */}}
{{- define "joblease-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "joblease-operator.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "joblease-operator.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels on every object (app.kubernetes.io/*), without a component. */}}
{{- define "joblease-operator.baseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "joblease-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: joblease
{{- end }}

{{/* Labels of the operator's own objects. */}}
{{- define "joblease-operator.labels" -}}
{{ include "joblease-operator.baseLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels that select the operator's pods (never change them after install). */}}
{{- define "joblease-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "joblease-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount name. */}}
{{- define "joblease-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "joblease-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The username the API server gives the operator (exempt from the admission policy). */}}
{{- define "joblease-operator.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "joblease-operator.serviceAccountName" . }}
{{- end }}

{{/* The image reference: digest wins over tag; the tag defaults to appVersion. */}}
{{- define "joblease-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Where the operator touches its heartbeat with probe.mode "exec" (the memory /tmp). */}}
{{- define "joblease-operator.heartbeatFile" -}}
/tmp/joblease-alive
{{- end }}

{{/* The heartbeat check: joblease.controller.heartbeat.PROBE_SOURCE, verbatim (a test
     compares them). It imports nothing of joblease, so a probe costs ~20 ms. */}}
{{- define "joblease-operator.heartbeatSource" -}}
import os,sys,time
try: age=time.time()-os.stat(sys.argv[1]).st_mtime
except OSError as e: sys.exit(f'no heartbeat: {e}')
sys.exit(f'heartbeat {age:.1f}s old (max {sys.argv[2]}s)' if age>float(sys.argv[2]) else 0)
{{- end }}

{{/* An exec probe command: (list $root maxAgeSeconds) → a JSON list. */}}
{{- define "joblease-operator.heartbeatProbe" -}}
{{- $root := index . 0 -}}
{{- toJson (list "python" "-I" "-c" (include "joblease-operator.heartbeatSource" $root) (include "joblease-operator.heartbeatFile" $root) (toString (index . 1))) }}
{{- end }}

{{/* Fail when extraArgs or extraEnv set what an `operator.*` value sets: the operator would
     get both (and refuse to start on a disagreement), so say which value to use instead. */}}
{{- define "joblease-operator.refuseOverriddenSettings" -}}
{{- $byFlag := dict "--margin-seconds" "operator.marginSeconds" "--writers" "operator.writers" "--max-server-skew" "operator.maxServerSkewSeconds" "--clock-track-ttl" "operator.clockTrackTTLSeconds" "--namespace" "operator.watchNamespaces" "--log-level" "operator.logLevel" "--verbose" "operator.logLevel (DEBUG)" "--dispatch-pools" "operator.dispatchPools" }}
{{- range .Values.extraArgs }}
{{- $flag := regexReplaceAll "=.*$" (toString .) "" }}
{{- if hasKey $byFlag $flag }}
{{- fail (printf "extraArgs has %s, which the chart sets from %s: set that value instead" $flag (get $byFlag $flag)) }}
{{- end }}
{{- end }}
{{- $byEnv := dict "JOBLEASE_MARGIN_SECONDS" "operator.marginSeconds" "JOBLEASE_OPERATOR_WRITERS" "operator.writers" "JOBLEASE_MAX_SERVER_SKEW" "operator.maxServerSkewSeconds" "JOBLEASE_CLOCK_TRACK_TTL" "operator.clockTrackTTLSeconds" "JOBLEASE_DISPATCH_POOLS" "operator.dispatchPools" }}
{{- range .Values.extraEnv }}
{{- $name := toString (.name | default "") }}
{{- if hasKey $byEnv $name }}
{{- fail (printf "extraEnv sets %s, which the chart sets from %s: set that value instead" $name (get $byEnv $name)) }}
{{- end }}
{{- end }}
{{- end }}
