// Starts Swagger UI on /docs. Kept out of the page so the Content-Security-Policy can forbid inline script.
window.addEventListener("DOMContentLoaded", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = window.SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    deepLinking: true,
    // The default asks a public validator about the schema: this page talks to its own server only.
    validatorUrl: null,
    presets: [window.SwaggerUIBundle.presets.apis],
  });
});
