{{/* Names and labels shared by every template. */}}

{{- define "dra-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dra-exporter.fullname" -}}
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

{{- define "dra-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dra-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dra-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: exporter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dra-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dra-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dra-exporter.claimTemplateName" -}}
{{- printf "%s-gpus" (include "dra-exporter.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The scheme of /metrics, /healthz and /readyz. */}}
{{- define "dra-exporter.scheme" -}}
{{- if and .Values.webConfig.enabled .Values.webConfig.tls -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* A probe: HTTP(S) on path, or a TCP check when basic auth would refuse the kubelet. */}}
{{- define "dra-exporter.probe" -}}
{{- if and .root.Values.webConfig.enabled .root.Values.webConfig.clientCertificates -}}
tcpSocket:
  port: metrics
{{- else -}}
httpGet:
  path: {{ .path }}
  port: metrics
  scheme: {{ include "dra-exporter.scheme" .root }}
{{- end -}}
{{- end -}}

{{/*
The scrape relabelings of the ServiceMonitor and the PodMonitor: the chart's own first (the
dashboards pick nodes by instance, the rules select job="dra-exporter"), then the user's.
*/}}
{{- define "dra-exporter.relabelings" -}}
# Device series carry no node label of their own: name the target (instance) after its
# node, and give it the job the dashboards and alert rules select on, whatever the release
# is called. No separate "node" target label: info families such as dra_device_info carry
# their own, which it would rename to exported_node.
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: instance
  - targetLabel: job
    replacement: dra-exporter
  {{- with .relabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Extra endpoint fields; relabelings there would replace the chart's own, so they are refused. */}}
{{- define "dra-exporter.endpointExtras" -}}
{{- $where := index . 0 -}}
{{- $extra := index . 1 -}}
{{- range $key := list "relabelings" "metricRelabelings" }}
{{- if hasKey $extra $key }}
{{- fail (printf "%s.endpoint.%s would replace the chart's own relabelings: set %s.%s instead (appended to them)" $where $key $where $key) }}
{{- end }}
{{- end }}
{{- with $extra }}
{{- toYaml . }}
{{- end }}
{{- end }}
