{{/* Where the kubelet probes the reconciler: its listen host, or loopback when it listens on every address. */}}
{{- define "hereabouts.probeHost" -}}
{{- $host := trimAll "[]" .Values.metrics.host -}}
{{- if or (eq $host "0.0.0.0") (eq $host "::") -}}127.0.0.1{{- else -}}{{ $host }}{{- end -}}
{{- end -}}
