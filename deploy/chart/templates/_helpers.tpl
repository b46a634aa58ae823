{{/* Whether the DaemonSet pod runs in the host's network namespace (a string "true" from --set-string counts). */}}
{{- define "hereabouts.hostNetwork" -}}
{{- if eq (toString .Values.hostNetwork) "true" -}}true{{- else -}}false{{- end -}}
{{- end -}}

{{/* Where the reconciler listens: metrics.host, else loopback in the host's network (what it serves is
unauthenticated) and every address of its own network namespace otherwise (the kubelet probes the pod's IP). */}}
{{- define "hereabouts.listenHost" -}}
{{- if .Values.metrics.host -}}{{ .Values.metrics.host }}
{{- else if eq (include "hereabouts.hostNetwork" .) "true" -}}127.0.0.1
{{- else -}}0.0.0.0
{{- end -}}
{{- end -}}

{{/* Where the kubelet probes the reconciler in the host's network: its listen host, or loopback when it listens
on every address. */}}
{{- define "hereabouts.probeHost" -}}
{{- $host := trimAll "[]" (include "hereabouts.listenHost" .) -}}
{{- if or (eq $host "0.0.0.0") (eq $host "::") -}}127.0.0.1{{- else -}}{{ $host }}{{- end -}}
{{- end -}}

{{/* A boolean value, also when given as the string "true" or "false" (--set-string). */}}
{{- define "hereabouts.on" -}}
{{- if eq (toString .) "true" -}}true{{- end -}}
{{- end -}}

{{/* The image: repository@digest when a digest is given, else repository:tag (the chart's appVersion by default). */}}
{{- define "hereabouts.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The labels of every object: Helm's standard ones. Selectors and the pod template keep app.kubernetes.io/name
alone, so an upgrade never changes what the DaemonSet selects, nor rolls pods for a chart version alone. */}}
{{- define "hereabouts.labels" -}}
app.kubernetes.io/name: {{ include "hereabouts.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The name label's value: nameOverride, else hereabouts. `kubectl hereabouts` finds the chart's namespace by
this label's default value; with another, give it -n. */}}
{{- define "hereabouts.name" -}}
{{- .Values.nameOverride | default "hereabouts" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: fullnameOverride, else hereabouts (whatever the release is called: one
install per cluster, and the names are Whereabouts-like and documented). Short enough for the longest suffix. */}}
{{- define "hereabouts.fullname" -}}
{{- .Values.fullnameOverride | default "hereabouts" | trunc 50 | trimSuffix "-" -}}
{{- end -}}
